"""The main job, end to end on Multi30k: vocabulary, training, checkpoint averaging and length
penalty chosen on val, test2016 evaluation with beam 4, SavedModel export, example translations,
a summary.

    keras-transformer demo                 # quick: 1,200 steps of a 2-layer model
    keras-transformer demo --full          # the full recipe: an ensemble of three 5,500-step models
    keras-transformer demo --tgt-lang fr   # the same for English -> French (full: one model)

The quick run (`make demo`) trains the recipe (settings below) with 2 layers and no dropout for
1,200 optimizer steps. The full run keeps the 3-layer model for 5,500 steps with P_drop 0.3
(en-fr: 0.2); for en-de it trains two more models into the ensemble's member directories and
decodes the three as an ensemble (ENSEMBLE_BY_TARGET). Each member's weights are chosen on val
alone, then the ensemble's length penalty. docs/results.md has the sweeps behind each choice.
Both recipes are bounded by steps, not by the clock, so every machine trains the same recipe
(a slower machine takes longer), in mixed_bfloat16 where the CPU has bf16 and in float32
elsewhere (`precision: auto`). Every choice the job makes is made on val and saved in the run
(`decoding.decoder.Decoder.save_choice`), so that translate, evaluate and export decode as the
job did; test2016 is decoded once, at the end, and only reported.
"""

import logging
import pathlib
import time

from keras_transformer.decoding.request import DEFAULTS
from keras_transformer.defaults import EXPORT_DIR, MAX_LENGTH, TRAIN_TOKENS_PER_BATCH, VOCAB_SIZE
from keras_transformer.tasks.tuning import (AVERAGE_CANDIDATES, ALPHAS, VAL_SENTENCES,  # noqa: F401
                                           choose_alpha, choose_weights)

log = logging.getLogger(__name__)

# Settings both recipes share. Checkpoints by steps only (the minutes' clock never fires), so
# that the averaging candidates are evenly spaced.
COMMON = dict(dataset="multi30k", tokens_per_batch=TRAIN_TOKENS_PER_BATCH,
              max_length=MAX_LENGTH, eval_steps=500, checkpoint_minutes=10_000,
              checkpoint_steps=100)
# The recipe: the `multi30k` preset (3 layers, d_model 256, d_ff 1024, 4 heads, P_drop 0.2;
# 7.6M parameters with 8000 shared pieces) and the paper's schedule with warmup 800. The quick
# run trains it with 2 layers (5.7M parameters) and no dropout; the full run with P_drop 0.3,
# and en-fr keeps the 0.2 it was measured with.
RECIPE = dict(COMMON, preset="multi30k", vocab_size=VOCAB_SIZE, warmup_steps=800)
QUICK = dict(RECIPE, num_layers=2, dropout=0.0, train_steps=1200, keep_checkpoints=10)
FULL = dict(RECIPE, dropout=0.3, train_steps=5500, keep_checkpoints=40)
FULL_BY_TARGET = {"fr": dict(dropout=0.2)}  # changes to FULL for one target language
# The full en-de recipe decodes an ensemble of three models (the mean of their next-token
# probabilities, `models.Ensemble`), trained one after the other with FULL's settings and these
# changes. en-fr stays one model.
ENSEMBLE_BY_TARGET = {"de": (("l3-d0.3", {}), ("l3-d0.2", dict(dropout=0.2)),
                             ("l2-d0.1", dict(num_layers=2, dropout=0.1)))}
# What a finished member run must have been trained with for the job to use it as is.
MEMBER_CHECKS = ("train_steps", "vocab_size", "tokens_per_batch", "warmup_steps", "dataset",
                 "src_lang", "tgt_lang")
TRAIN_SUMMARY, SUMMARY = "train_summary.json", "summary.json"  # files the job adds to the run
EXAMPLES = ["A little girl climbs into a wooden playhouse.",
            "Two men are playing chess in the park.",
            "A dog is running through the snow."]


def recipe(full=False, tgt_lang="de"):
    """The settings the job trains with: QUICK, or FULL with its changes for `tgt_lang`."""
    return dict(FULL, **FULL_BY_TARGET.get(tgt_lang, {})) if full else dict(QUICK)


def members(full=False, tgt_lang="de"):
    """[(name, settings)] of the models the job trains: [(None, recipe)] for one model (trained
    in the run directory itself), or the full recipe's ensemble members for `tgt_lang`."""
    settings = recipe(full, tgt_lang)
    if not full or tgt_lang not in ENSEMBLE_BY_TARGET:
        return [(None, settings)]
    return [(name, dict(settings, **changes)) for name, changes in ENSEMBLE_BY_TARGET[tgt_lang]]


def _check_member(run, config):
    """A finished run reused as a member must match the recipe: RunError names what differs."""
    saved = run.config
    differs = [f"{key} {getattr(saved, key)!r} (the recipe: {getattr(config, key)!r})"
               for key in MEMBER_CHECKS if getattr(saved, key) != getattr(config, key)]
    wanted, have = config.resolved().architecture, saved.architecture
    differs += [f"{key} {have.get(key)!r} (the recipe: {value!r})"
                for key, value in sorted(wanted.items()) if have.get(key) != value]
    if differs:
        from keras_transformer.errors import RunError

        raise RunError(f"{run.directory} holds a model trained with other settings: "
                       f"{'; '.join(differs)}. Delete it (or give another --output-dir) to train "
                       f"the recipe's.")


def run(full=False, src_lang="en", tgt_lang="de", output_dir=None, export_dir=EXPORT_DIR,
        train_steps=None, settings=None):
    """Runs the main job; returns the summary dict (also written to RUN_DIR/summary.json).

    `settings`: more training settings for every model it trains, e.g. `prepared_data` and
    `source_dir` where the corpus is carried prepared (benchmarks/gpu_check.py)."""
    import keras

    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.evaluation.evaluate import evaluate_split
    from keras_transformer.models import Ensemble
    from keras_transformer.runs import EnsembleRun, Run, make_config
    from keras_transformer.training.trainer import train
    from pipelines import datasets

    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    mode = "full" if full else "quick"
    specs = members(full, tgt_lang)
    extra = dict(settings or {}, **({} if train_steps is None else {"train_steps": train_steps}))
    specs = [(name, dict(member, **extra)) for name, member in specs]
    name = f"multi30k-{src_lang}-{tgt_lang}-{mode}"
    run_dir = pathlib.Path(output_dir or pathlib.Path("runs") / name)
    started = time.monotonic()
    summary = {"job": f"Multi30k {src_lang}->{tgt_lang}, {mode} recipe", "run_dir": str(run_dir)}
    ensemble = len(specs) > 1
    if ensemble:
        summary["job"] += f" (an ensemble of {len(specs)} models)"

    beam = DEFAULTS["beam_size"]
    # Per member (key None: the one model of a single-model job).
    member_runs, trainings, weights, val_scores = [], {}, {}, {}
    for number, (member, settings) in enumerate(specs, 1):
        directory = EnsembleRun.member_directory(run_dir, member) if member else run_dir
        which = f" member {number}/{len(specs)} ({member})" if member else ""
        config = make_config(None, origin="recipe", src_lang=src_lang, tgt_lang=tgt_lang,
                             output_dir=str(directory), **settings)
        member_run = Run(directory)
        print(f"== 1/5 training{which} ({mode}: {settings['train_steps']} optimizer steps) "
              f"-> {directory}", flush=True)
        if member_run.has_model():
            print(f"{directory} holds a trained model: training is done (delete {directory} to "
                  "train again).", flush=True)
            if ensemble:
                _check_member(member_run, config)
            training = member_run.read_json(TRAIN_SUMMARY, default={})
        else:
            training = train(config)
            member_run.write_json(TRAIN_SUMMARY, training)
        trainings[member] = training
        member_runs.append(member_run)
    summary["training"] = trainings if ensemble else trainings[None]
    config = member_runs[0].config
    top = EnsembleRun(run_dir, member_runs) if ensemble else member_runs[0]
    tokenizer = top.vocabulary()  # an ensemble's: checked to be shared by its members

    print("== 2/5 choosing on val: the weights (final, or an average of checkpoints)"
          f"{' of each member' if ensemble else ''}, then the length penalty", flush=True)
    texts = {split: datasets.split_texts(config.dataset, split, **config.data_arguments())
             for split in ("dev", "test")}  # each split read once
    dev_sources, dev_references = texts["dev"]
    models = []
    for (member, _), member_run in zip(specs, member_runs):
        if member:
            print(f"  member {member}:", flush=True)
        model, weights[member], val_scores[member] = choose_weights(
            member_run, dev_sources[:VAL_SENTENCES], dev_references[:VAL_SENTENCES])
        averaged = member_run.save_model(model, averaged=True)
        print(f"chosen{f' for {member}' if member else ''}: {weights[member]} -> {averaged}",
              flush=True)
        models.append(model)
    if ensemble:
        model = Ensemble(models)
        chosen = "; ".join(f"{member}: {label}" for member, label in weights.items())
        summary["weights"], summary["val_greedy_sacrebleu"] = weights, val_scores
    else:
        chosen = summary["weights"] = weights[None]
        summary["val_greedy_sacrebleu"] = val_scores[None]
    alpha, alpha_scores = choose_alpha(model, tokenizer, config.max_length,
                                       dev_sources[:VAL_SENTENCES],
                                       dev_references[:VAL_SENTENCES], beam)
    summary["alpha"] = alpha
    summary["val_beam_sacrebleu_by_alpha"] = {str(a): v for a, v in alpha_scores.items()}
    # The run remembers the choices: translate, evaluate and export decode as the job does.
    chosen_by = f"keras-transformer demo on val (first {VAL_SENTENCES} sentences)"
    Decoder.save_choice(top, beam_size=beam, alpha=alpha, chosen_by=chosen_by,
                        **({"weights": chosen} if ensemble else
                           {"weights": chosen, "model": top.averaged_path.name}))
    print(f"chosen: alpha {alpha} (saved in {top.decoding_path})", flush=True)

    print(f"== 3/5 test2016 with beam {beam}, alpha {alpha}", flush=True)
    # The run's choice, just saved, decodes the model in memory.
    translator = Decoder.resolve(top).engine(model, tokenizer, config.max_length)
    # The quick job decodes test2016 only (val was used, greedy, to choose the weights).
    splits = (("dev", "val"), ("test", "test2016")) if full else (("test", "test2016"),)
    for split, key in splits:
        sources, references = texts[split]
        official = datasets.official_tokenized_references(config.dataset, split,
                                                          config.tgt_lang, config.source_dir)
        result = evaluate_split(translator, sources, references, lang=config.tgt_lang,
                                official_references=official,
                                output=top.hypotheses_path(key, beam), desc=f"{key} beam {beam}")
        summary[key] = {k: result[k] for k in ("sacrebleu", "chrf", "tokenized_bleu",
                                               "literature_bleu", "literature_references",
                                               "sacrebleu_signature")}
        print(f"{key}: " + "\n  ".join(result["lines"]), flush=True)

    summary["examples"] = {}
    if keras.backend.backend() == "tensorflow":
        _export_and_show(summary, model, top, config, export_dir, name, beam, alpha)
    else:
        print(f"== 4/5 SavedModel export: skipped (Keras runs on {keras.backend.backend()}; a "
              f"SavedModel is TensorFlow's): export the run later with KERAS_BACKEND=tensorflow "
              f"keras-transformer export --run-dir {run_dir}", flush=True)
        print("== 5/5 example translations (in process)", flush=True)
        for source, output in zip(EXAMPLES, translator.translate(EXAMPLES)):
            summary["examples"][source] = output
            print(f"  {source}\n    -> {output}", flush=True)

    summary["job_minutes"] = round((time.monotonic() - started) / 60, 1)
    top.write_json(SUMMARY, summary)
    print("\n== summary", flush=True)
    print(f"  {summary['job']}; preset {config.preset} ({model.count_params():,} parameters)")
    for member, training in trainings.items():
        if training:
            line = _training_line(training)
            print(f"  {member}: {line.strip()}" if member else line)
    print(f"  weights: {chosen}; length penalty alpha {alpha} (both chosen on val)")
    for key in ("val", "test2016"):
        if key in summary:
            result = summary[key]
            print(f"  {key}: sacreBLEU {result['sacrebleu']:.2f} (chrF {result['chrf']:.2f}), "
                  f"beam {beam}; {result['sacrebleu_signature']}")
            print(f"  {key}: BLEU {result['literature_bleu']:.2f} in the Multi30k literature "
                  f"convention (lowercased, Moses-tokenized, {result['literature_references']}"
                  " references)")
    print(f"  SavedModel: {summary.get('saved_model', 'not exported (see step 4/5)')}")
    print(f"  whole job: {summary['job_minutes']} min; details in {top.file(SUMMARY)}",
          flush=True)
    return summary


def _training_line(training):
    """The summary's training line; a resumed run names the steps its last piece trained (the
    minutes are that piece's)."""
    start, step = training.get("start_step") or 0, training.get("step")
    resumed = f" (this piece: steps {start}-{step})" if start else ""
    precision = f" in {training['precision']}" if training.get("precision") else ""
    minutes = training.get("seconds", 0) / 60
    return (f"  training: step {step}{resumed}{precision} in {minutes:.1f} min "
            f"({training.get('stopped')}); dev perplexity "
            f"{training.get('val_perplexity', float('nan')):.2f}")


def _export_and_show(summary, model, run, config, export_dir, name, beam, alpha):
    """Steps 4 and 5 on TensorFlow: the SavedModel export, and the examples through it."""
    import tensorflow as tf
    from absl import logging as absl_logging

    from keras_transformer.export.saved_model import export_saved_model

    absl_logging.set_verbosity(absl_logging.WARNING)
    print(f"== 4/5 SavedModel export -> {export_dir}/{name}/", flush=True)
    path = export_saved_model(model, run.tokenizer(), pathlib.Path(export_dir) / name,
                              max_input_length=config.max_length, beam_size=beam, alpha=alpha)
    summary["saved_model"] = str(path)
    print(f"exported to {path}", flush=True)

    print("== 5/5 example translations through the exported SavedModel", flush=True)
    loaded = tf.saved_model.load(str(path))
    outputs = loaded.serve(tf.constant(EXAMPLES), beam_size=tf.constant(beam),
                           alpha=tf.constant(alpha, tf.float32))["translations"].numpy()
    for source, output in zip(EXAMPLES, outputs):
        summary["examples"][source] = output.decode("utf-8")
        print(f"  {source}\n    -> {output.decode('utf-8')}", flush=True)
