"""The multilingual main job: one model for several Multi30k pairs (en->de, fr, cs), trained
with the quick demo's recipe and as many times its optimizer steps as it has pairs (the
compute of that many bilingual demos), its weights and length penalty chosen on val, test2016
decoded once per pair at the end, one SavedModel exported.

    keras-transformer demo --tgt-lang de fr cs     # this job
    keras-transformer demo --tgt-lang fr           # a bilingual demo (tasks/main_job.py)

Per pair it reports sacreBLEU, chrF, the Multi30k literature's BLEU and the share of outputs in
another language than asked (`evaluation.language_id`, py3langid over the run's languages).
Choices on val: the weights (final or an average of checkpoints, `tasks.tuning`) and alpha by
the greedy / beam sacreBLEU of the first VAL_SENTENCES val sentences of every pair together
(each tagged with its target), one choice for the model. Checkpoints and dev evaluations come
every that many times the bilingual recipe's steps, so that the averaging candidates span the
same share of training.
"""

import dataclasses
import logging
import pathlib
import time

from keras_transformer.decoding.request import DEFAULTS, EVALUATE
from keras_transformer.defaults import EXPORT_DIR
from keras_transformer.tasks.main_job import EXAMPLES, QUICK, SUMMARY, TRAIN_SUMMARY
from keras_transformer.tasks.tuning import VAL_SENTENCES, choose_alpha, choose_weights

log = logging.getLogger(__name__)


def recipe(targets, train_steps=None):
    """The quick recipe for len(targets) pairs: its steps, checkpoints and evaluations scaled."""
    scale = len(targets)
    return dict(QUICK, tgt_lang=list(targets),
                train_steps=train_steps or QUICK["train_steps"] * scale,
                checkpoint_steps=QUICK["checkpoint_steps"] * scale,
                eval_steps=QUICK["eval_steps"] * scale)


def run(targets, src_lang="en", output_dir=None, export_dir=EXPORT_DIR, train_steps=None,
        settings=None):
    """Runs the multilingual job; returns the summary (also RUN_DIR/summary.json).

    `settings`: more training settings (e.g. `source_dir`, a tiny `preset` in tests)."""
    import keras

    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.runs import Run, make_config
    from keras_transformer.training.trainer import train
    from pipelines.multilingual import tagged

    targets = list(targets)
    name = f"multi30k-{src_lang}-{'+'.join(targets)}-quick"
    run_dir = pathlib.Path(output_dir or pathlib.Path("runs") / name)
    started = time.monotonic()
    values = dict(recipe(targets, train_steps), **(settings or {}))
    config = make_config(None, origin="recipe", src_lang=src_lang, output_dir=str(run_dir),
                         **values)
    summary = {"job": f"Multi30k {src_lang}->{', '.join(targets)}, one model, quick recipe x "
               f"{len(targets)}", "run_dir": str(run_dir)}
    top = Run(run_dir)
    print(f"== 1/5 training ({config.train_steps} optimizer steps, {len(targets)} pairs) -> "
          f"{run_dir}", flush=True)
    if top.has_model():
        print(f"{run_dir} holds a trained model: training is done (delete it to train again).",
              flush=True)
        summary["training"] = top.read_json(TRAIN_SUMMARY, default={})
    else:
        summary["training"] = train(config)
        top.write_json(TRAIN_SUMMARY, summary["training"])
    config, tokenizer = top.config, top.vocabulary()

    print("== 2/5 choosing on val (every pair's first sentences, tagged): the weights, then "
          "the length penalty", flush=True)
    texts = pair_texts(config)
    sources = [tagged(s, t) for t in targets for s in texts[t]["dev"][0][:VAL_SENTENCES]]
    references = [r for t in targets for r in texts[t]["dev"][1][:VAL_SENTENCES]]
    model, weights, summary["val_greedy_sacrebleu"] = choose_weights(top, sources, references)
    summary["weights"] = weights
    print(f"chosen: {weights} -> {top.save_model(model, averaged=True)}", flush=True)
    beam = DEFAULTS["beam_size"]
    alpha, by_alpha = choose_alpha(model, tokenizer, config.max_length, sources, references,
                                   beam)
    summary["alpha"] = alpha
    summary["val_beam_sacrebleu_by_alpha"] = {str(a): v for a, v in by_alpha.items()}
    Decoder.save_choice(top, beam_size=beam, alpha=alpha, weights=weights,
                        model=top.averaged_path.name,
                        chosen_by=f"keras-transformer demo on val (first {VAL_SENTENCES} "
                        "sentences of every pair)")

    print(f"== 3/5 test2016 with beam {beam}, alpha {alpha}, per pair", flush=True)
    engine = Decoder.resolve(top, command=EVALUATE).engine(model, tokenizer, config.max_length)
    summary["test2016"] = {t: evaluate_pair(engine, top, config, t, *texts[t]["test"], beam)
                           for t in targets}

    summary["examples"] = {}
    if keras.backend.backend() == "tensorflow":
        export_and_show(summary, model, top, config, export_dir, name, beam, alpha)
    summary["job_minutes"] = round((time.monotonic() - started) / 60, 1)
    top.write_json(SUMMARY, summary)
    print("\n== summary", flush=True)
    print(f"  {summary['job']}; {model.count_params():,} parameters; weights {weights}, "
          f"alpha {alpha} (chosen on val)")
    print(pair_table(summary["test2016"]))
    print(f"  SavedModel: {summary.get('saved_model', 'not exported')}")
    print(f"  whole job: {summary['job_minutes']} min; details in {top.file(SUMMARY)}",
          flush=True)
    return summary


def pair_texts(config):
    """{target: {"dev": (sources, references), "test": (...)}} of every pair (untagged)."""
    from pipelines import datasets

    return {pair.tgt_lang: {split: datasets.split_texts(
        config.dataset, split, **config.data_arguments(pair.tgt_lang))
        for split in ("dev", "test")} for pair in config.data.pairs()}


def evaluate_pair(engine, run, config, target, sources, references, beam):
    """test2016 of one pair: the scores, and the share of hypotheses in another language."""
    from keras_transformer.evaluation.evaluate import evaluate_split
    from keras_transformer.evaluation.language_id import wrong_language_share
    from pipelines import datasets

    engine.set_languages(dataclasses.replace(engine.languages, default=target))
    output = run.hypotheses_path("test2016", beam, target)
    official = datasets.official_tokenized_references(config.dataset, "test", target,
                                                      config.source_dir)
    result = evaluate_split(engine, sources, references, lang=target,
                            official_references=official, output=output,
                            desc=f"test2016 {target}")
    hypotheses = output.read_text(encoding="utf-8").splitlines()
    languages = {config.pair(target).src_lang, *config.target_languages}
    share, found = wrong_language_share(hypotheses, target, languages)
    print(f"{config.pair(target).name}: " + "\n  ".join(result["lines"])
          + f"\n  wrong language: {100 * share:.2f}% ({found})", flush=True)
    return {**{k: result[k] for k in ("sacrebleu", "chrf", "tokenized_bleu", "literature_bleu",
                                      "literature_references", "sacrebleu_signature")},
            "wrong_language": round(share, 4), "languages_found": found}


def pair_table(results):
    """One line per pair: sacreBLEU, chrF, literature BLEU, wrong-language share."""
    lines = [f"  {'pair':<8} {'sacreBLEU':>9} {'chrF':>6} {'lit. BLEU':>9} {'wrong lang.':>11}"]
    for target, result in results.items():
        lines.append(f"  {target:<8} {result['sacrebleu']:>9.2f} {result['chrf']:>6.2f} "
                     f"{result['literature_bleu']:>9.2f} "
                     f"{100 * result['wrong_language']:>10.2f}%")
    return "\n".join(lines)


def export_and_show(summary, model, run, config, export_dir, name, beam, alpha):
    """The SavedModel (its `target_language` input: every pair), and the examples through it
    in every language."""
    import tensorflow as tf

    from keras_transformer.export.saved_model import export_saved_model

    print(f"== 4/5 SavedModel export -> {export_dir}/{name}/", flush=True)
    path = export_saved_model(model, run.tokenizer(), pathlib.Path(export_dir) / name,
                              max_input_length=config.max_length, beam_size=beam, alpha=alpha,
                              languages=config.target_languages)
    summary["saved_model"] = str(path)
    print("== 5/5 example translations through the exported SavedModel, every language",
          flush=True)
    loaded = tf.saved_model.load(str(path))
    for target in config.target_languages:
        outputs = loaded.signatures["serving_default"](
            sentences=tf.constant(EXAMPLES), beam_size=tf.constant(beam),
            alpha=tf.constant(alpha, tf.float32), prefixes=tf.constant([], tf.string),
            constraints=tf.constant([], tf.string),
            target_language=tf.constant([target]),
            no_repeat_ngram_size=tf.constant(0), repetition_penalty=tf.constant(1.0),
        )["translations"].numpy()
        summary["examples"][target] = [o.decode("utf-8") for o in outputs]
        for source, output in zip(EXAMPLES, summary["examples"][target]):
            print(f"  [{target}] {source}\n    -> {output}", flush=True)
