"""The main job, end to end on Multi30k: vocabulary, training, checkpoint averaging chosen on
val, test2016 evaluation with beam 4, SavedModel export, example translations, a summary.

    keras-transformer demo                 # quick: about 12 minutes of training on 2 cores
    keras-transformer demo --full          # the full recipe: 95 minutes of training
    keras-transformer demo --tgt-lang fr   # the same recipe for English -> French

The recipe is the `multi30k` preset with the settings below; only the training time (and the
checkpoint spacing that follows from it) differs between the quick and the full run. Every
choice the job makes (which checkpoints to average) is made on val; test2016 is only reported.
"""

import logging
import pathlib
import sys
import time

from keras_transformer.defaults import MAX_LENGTH, TRANSLATION
from pipelines import datasets

log = logging.getLogger(__name__)

# Training settings of the recipe (beyond the preset's architecture and dropout).
RECIPE = dict(
    preset="multi30k", dataset="multi30k", vocab_size=8000, tokens_per_batch=4096,
    max_length=MAX_LENGTH, train_steps=100_000, eval_steps=500, keep_checkpoints=10,
    checkpoint_minutes=30,
)
QUICK = dict(time_limit_minutes=12, checkpoint_steps=100)
FULL = dict(time_limit_minutes=95, checkpoint_steps=400)
AVERAGE_CANDIDATES = (1, 3, 5, 8)  # last-k checkpoints tried; 1 = the final weights
VAL_SENTENCES = 500  # val sentences decoded (greedy) to choose among the candidates
TRAIN_SUMMARY, SUMMARY = "train_summary.json", "summary.json"  # files the job adds to the run
EXAMPLES = ["A little girl climbs into a wooden playhouse.",
            "Two men are playing chess in the park.",
            "A dog is running through the snow."]


def _choose_weights(run, sources, references):
    """Final weights or an average of the last k checkpoints, whichever has the best greedy
    sacreBLEU on the given val sentences. Returns (model, label, val scores)."""
    from keras_transformer.decoding.translate import Translator
    from keras_transformer.evaluation.bleu import score

    config, tokenizer = run.config, run.tokenizer()
    available = len(run.checkpoints())
    results, best = {}, None
    for k in AVERAGE_CANDIDATES:
        if k > 1 and k > available:
            continue
        if k == 1:
            model = run.load_model(prefer_averaged=False)
            label = "final weights"
        else:
            model, _ = run.average(k)
            label = f"average of the last {k} checkpoints"
        translator = Translator(model, tokenizer, beam_size=1,
                                max_input_length=config.max_length)
        bleu = score(translator.translate(sources), references)["sacrebleu"]
        results[label] = bleu
        print(f"  val (first {len(sources)} sentences, greedy): {label}: sacreBLEU {bleu:.2f}",
              flush=True)
        if best is None or bleu > best[2]:
            best = (model, label, bleu)
    return best[0], best[1], results


def run(full=False, src_lang="en", tgt_lang="de", output_dir=None, export_dir="saved_models",
        time_limit_minutes=None):
    """Runs the main job; returns the summary dict (also written to RUN_DIR/summary.json)."""
    import tensorflow as tf
    from absl import logging as absl_logging
    from tqdm import tqdm

    from keras_transformer.decoding.translate import Translator
    from keras_transformer.evaluation.bleu import score
    from keras_transformer.export.saved_model import export_saved_model
    from keras_transformer.runs import Run, make_config
    from keras_transformer.runs.run import write_lines
    from keras_transformer.training.trainer import train

    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    mode = "full" if full else "quick"
    settings = {**RECIPE, **(FULL if full else QUICK)}
    if time_limit_minutes is not None:
        settings["time_limit_minutes"] = time_limit_minutes
    name = f"multi30k-{src_lang}-{tgt_lang}-{mode}"
    run_dir = pathlib.Path(output_dir or pathlib.Path("runs") / name)
    config = make_config(None, src_lang=src_lang, tgt_lang=tgt_lang, output_dir=str(run_dir),
                         **settings)
    started = time.monotonic()
    summary = {"job": f"Multi30k {src_lang}->{tgt_lang}, {mode} recipe", "run_dir": str(run_dir)}

    beam, alpha = TRANSLATION.beam_size, TRANSLATION.alpha
    run = Run(run_dir)
    print(f"== 1/5 training ({mode}: at most {settings['time_limit_minutes']} minutes) "
          f"-> {run_dir}", flush=True)
    if run.has_model():
        print(f"{run_dir} holds a trained model: training is done (delete {run_dir} to train "
              "again).", flush=True)
        summary["training"] = run.read_json(TRAIN_SUMMARY, default={})
    else:
        summary["training"] = train(config)
        run.write_json(TRAIN_SUMMARY, summary["training"])
    config, tokenizer = run.config, run.tokenizer()

    print("== 2/5 choosing the weights on val (final, or the average of the last k "
          "checkpoints)", flush=True)
    texts = {split: datasets.split_texts(config.dataset, split, **config.data_arguments())
             for split in ("dev", "test")}  # each split read once
    dev_sources, dev_references = texts["dev"]
    model, chosen, val_scores = _choose_weights(run, dev_sources[:VAL_SENTENCES],
                                                dev_references[:VAL_SENTENCES])
    averaged = run.save_model(model, averaged=True)
    summary["weights"] = chosen
    summary["val_greedy_sacrebleu"] = val_scores
    print(f"chosen: {chosen} -> {averaged}", flush=True)

    print(f"== 3/5 test2016 with beam {beam}, alpha {alpha}", flush=True)
    translator = Translator(model, tokenizer, beam_size=beam, alpha=alpha,
                            max_input_length=config.max_length)
    # The quick job decodes test2016 only (val was used, greedy, to choose the weights).
    splits = (("dev", "val"), ("test", "test2016")) if full else (("test", "test2016"),)
    for split, key in splits:
        sources, references = texts[split]
        with tqdm(total=len(sources), unit=" sentences", desc=f"{key} beam {beam}",
                  file=sys.stderr) as bar:
            hypotheses = translator.translate(sources, progress=bar)
        write_lines(run.hypotheses_path(key, beam), hypotheses)
        result = score(hypotheses, references)
        summary[key] = {k: result[k] for k in ("sacrebleu", "chrf", "tokenized_bleu",
                                               "sacrebleu_signature")}
        print(f"{key}: " + "\n  ".join(result["lines"]), flush=True)

    print(f"== 4/5 SavedModel export -> {export_dir}/{name}/", flush=True)
    path = export_saved_model(model, tokenizer, pathlib.Path(export_dir) / name,
                              max_input_length=config.max_length)
    summary["saved_model"] = str(path)
    print(f"exported to {path}", flush=True)

    print("== 5/5 example translations through the exported SavedModel", flush=True)
    loaded = tf.saved_model.load(str(path))
    outputs = loaded.serve(tf.constant(EXAMPLES))["translations"].numpy()
    summary["examples"] = {}
    for source, output in zip(EXAMPLES, outputs):
        summary["examples"][source] = output.decode("utf-8")
        print(f"  {source}\n    -> {output.decode('utf-8')}", flush=True)

    summary["job_minutes"] = round((time.monotonic() - started) / 60, 1)
    run.write_json(SUMMARY, summary)
    training = summary["training"]
    print("\n== summary", flush=True)
    print(f"  {summary['job']}; preset {config.preset} ({model.count_params():,} parameters)")
    if training:
        print(f"  training: {training.get('step')} steps in {training.get('seconds', 0) / 60:.1f}"
              f" min ({training.get('stopped')}); dev perplexity "
              f"{training.get('val_perplexity', float('nan')):.2f}")
    print(f"  weights: {chosen}")
    if "val" in summary:
        print(f"  val sacreBLEU {summary['val']['sacrebleu']:.2f} (beam {beam})")
    print(f"  test2016 sacreBLEU "
          f"{summary['test2016']['sacrebleu']:.2f} (chrF {summary['test2016']['chrf']:.2f}), "
          f"beam {beam}; {summary['test2016']['sacrebleu_signature']}")
    print(f"  SavedModel: {path}")
    print(f"  whole job: {summary['job_minutes']} min; details in {run.file(SUMMARY)}",
          flush=True)
    return summary
