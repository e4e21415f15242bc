"""The main job, end to end on Multi30k: vocabulary, training, checkpoint averaging and length
penalty chosen on val, test2016 evaluation with beam 4, SavedModel export, example translations,
a summary.

    keras-transformer demo                 # quick: 1,200 steps of a 2-layer model
    keras-transformer demo --full          # the full recipe: an ensemble of three 5,500-step models
    keras-transformer demo --tgt-lang fr   # the same for English -> French (full: one model)

The quick run (`make demo`) trains the recipe (settings below) with 2 layers instead of 3 and
no dropout for 1,200 optimizer steps, the best on val in the step-budget sweep
(benchmarks/recipe_sweep.py; figures by RECIPE below and in the README). The full run keeps
the 3-layer model for 5,500 steps with P_drop 0.3 (en-fr: 0.2), the best measured on val; for
en-de it trains two more models (3 layers with P_drop 0.2, 2 layers with P_drop 0.1) into
RUN_DIR/members/ and decodes the three as an ensemble (ENSEMBLE_BY_TARGET). Each member's
weights are chosen on val alone, then the ensemble's length penalty. Both are bounded by
steps, not by the clock, so every machine trains the same model (a slower machine takes
longer). Every choice the job makes (which checkpoints to average, the length
penalty) is made on val; test2016 is decoded once, at the end, and only reported.
"""

import logging
import pathlib
import time

from keras_transformer.defaults import MAX_LENGTH, TRANSLATION

log = logging.getLogger(__name__)

# Settings both recipes share. Both are bounded by optimizer steps, never by the clock: every
# machine trains the same model (a slower one takes longer). Checkpoints by steps only, so
# that the averaging candidates are evenly spaced.
COMMON = dict(dataset="multi30k", tokens_per_batch=4096, max_length=MAX_LENGTH, eval_steps=500,
              checkpoint_minutes=10_000, checkpoint_steps=100)
# The recipe: the `multi30k` preset (3 layers, d_model 256, d_ff 1024, 4 heads, P_drop 0.2;
# 7.6M parameters with 8000 shared pieces), the paper's schedule with warmup 800. The quick run
# (`make demo`) trains it with 2 layers (5.7M parameters) and no dropout for 1200 steps. On val
# (greedy, first 500; benchmarks/recipe_sweep.py --steps 1200), final weights / the average of
# the last 5 checkpoints: 3 layers 31.68 / 32.48 (66 minutes of training on the AVX2 AMD EPYC
# with oneDNN off); 2 layers 34.52 / 34.07 (24.6 minutes, 1.23 s/step with oneDNN on); with
# P_drop 0.1 35.22 / 35.66; with P_drop 0 31.57 / 36.72 (its final weights overfit, val
# perplexity 9.02 against 7.63, but its checkpoints average best). 4000 or 10000 pieces did
# worse than 8000. At the full 5500 steps the 3 layers win on val (en-de, best candidate):
# P_drop 0.3 41.90, 0.2 41.52, and 2 layers with P_drop 0.1 40.22 (it overfits after step
# 2000); with 0.3 the dev perplexity still falls at step 5100 (5.39), with 0.2 it is flat from
# step 3400 (5.47). en-fr was trained and measured with the preset's P_drop 0.2 (0.3 not tried
# there), so it keeps that.
RECIPE = dict(COMMON, preset="multi30k", vocab_size=8000, warmup_steps=800)
QUICK = dict(RECIPE, num_layers=2, dropout=0.0, train_steps=1200, keep_checkpoints=10)
FULL = dict(RECIPE, dropout=0.3, train_steps=5500, keep_checkpoints=40)
FULL_BY_TARGET = {"fr": dict(dropout=0.2)}  # changes to FULL for one target language
# The full en-de recipe decodes an ensemble of three such models (the mean of their next-token
# probabilities, `models.Ensemble`), trained one after the other into RUN_DIR/members/NAME
# (`runs.EnsembleRun`) with FULL's settings and these changes. They are the three 5500-step variants above: alone
# their best val candidates are 41.90, 41.52 and 40.22 (greedy, first 500); together, each
# with the weights chosen alone, greedy 43.30 and beam 4 44.31 (alpha 1.4) against 42.69 for
# the best single model. The two 3-layer models alone give 42.14 greedy, 43.11 beam: the
# 2-layer model adds the most. A fourth member, the P_drop 0.3 model's own checkpoints
# 3600-4000 averaged, added nothing (43.17 greedy). en-fr stays one model.
ENSEMBLE_BY_TARGET = {"de": (("l3-d0.3", {}), ("l3-d0.2", dict(dropout=0.2)),
                             ("l2-d0.1", dict(num_layers=2, dropout=0.1)))}
# What a finished member run must have been trained with for the job to use it as is.
MEMBER_CHECKS = ("train_steps", "vocab_size", "tokens_per_batch", "warmup_steps", "dataset",
                 "src_lang", "tgt_lang")

# Weights tried on val: (k, j) = the average of the last k checkpoints taken j apart (every
# j-th one counting back from the newest); (1, 1) is the final weights.
AVERAGE_CANDIDATES = ((1, 1), (5, 1), (10, 1), (5, 2), (10, 2), (20, 1), (20, 2))
# GNMT length penalties tried on val with the beam (paper: 0.6). On the quick model's val
# (beam 4, first 500): 0.6 32.79, 1.0 33.44, 1.2 33.90, 1.4 34.09, then a cliff (1.6 28.90,
# 1.8 20.80: long, repeating output); 1.8 is tried so that the choice is never the grid's edge.
ALPHAS = (0.6, 1.0, 1.4, 1.8)
VAL_SENTENCES = 500  # val sentences decoded to make those choices
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


def _label(k, every):
    if k == 1:
        return "final weights"
    return f"average of the last {k} checkpoints" + (f", {every} apart" if every > 1 else "")


def _choose_weights(run, sources, references):
    """Final weights or an average of checkpoints (AVERAGE_CANDIDATES), whichever has the best
    greedy sacreBLEU on the given val sentences. Returns (model, label, val scores)."""
    from keras_transformer.decoding.translate import Translator
    from keras_transformer.evaluation.bleu import score

    config, tokenizer = run.config, run.vocabulary()
    available = len(run.checkpoints())
    results, best = {}, None
    for k, every in AVERAGE_CANDIDATES:
        if k > 1 and (k - 1) * every + 1 > available:
            continue
        label = _label(k, every)
        if k == 1:
            model = run.load_model(prefer_averaged=False)
        else:
            model, _ = run.average(k, every=every)
        translator = Translator(model, tokenizer, beam_size=1,
                                max_input_length=config.max_length)
        bleu = score(translator.translate(sources), references)["sacrebleu"]
        results[label] = bleu
        print(f"  val (first {len(sources)} sentences, greedy): {label}: sacreBLEU {bleu:.2f}",
              flush=True)
        if best is None or bleu > best[2]:
            best = (model, label, bleu)
    return best[0], best[1], results


def _choose_alpha(model, tokenizer, config, sources, references, beam):
    """The GNMT length penalty (ALPHAS) with the best beam sacreBLEU on the given val
    sentences. Returns (alpha, {alpha: (BLEU, brevity penalty)})."""
    import sacrebleu

    from keras_transformer.decoding.translate import Translator

    results, best = {}, None
    for alpha in ALPHAS:
        translator = Translator(model, tokenizer, beam_size=beam, alpha=alpha,
                                max_input_length=config.max_length)
        bleu = sacrebleu.corpus_bleu(translator.translate(sources), [references])
        results[alpha] = (round(bleu.score, 2), round(bleu.bp, 3))
        print(f"  val (first {len(sources)} sentences, beam {beam}): alpha {alpha}: sacreBLEU "
              f"{bleu.score:.2f} (brevity penalty {bleu.bp:.3f})", flush=True)
        if best is None or bleu.score > best[1]:
            best = (alpha, bleu.score)
    return best[0], results


def run(full=False, src_lang="en", tgt_lang="de", output_dir=None, export_dir="saved_models",
        train_steps=None):
    """Runs the main job; returns the summary dict (also written to RUN_DIR/summary.json)."""
    import keras
    from pipelines.progress import progress_bar

    from keras_transformer.decoding.translate import Translator
    from keras_transformer.evaluation.bleu import score
    from keras_transformer.models import Ensemble
    from keras_transformer.runs import EnsembleRun, Run, make_config
    from keras_transformer.runs.ensemble import MEMBERS
    from keras_transformer.runs.run import write_lines
    from keras_transformer.training.trainer import train
    from pipelines import datasets

    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    mode = "full" if full else "quick"
    specs = members(full, tgt_lang)
    if train_steps is not None:
        specs = [(name, dict(settings, train_steps=train_steps)) for name, settings in specs]
    name = f"multi30k-{src_lang}-{tgt_lang}-{mode}"
    run_dir = pathlib.Path(output_dir or pathlib.Path("runs") / name)
    started = time.monotonic()
    summary = {"job": f"Multi30k {src_lang}->{tgt_lang}, {mode} recipe", "run_dir": str(run_dir)}
    ensemble = len(specs) > 1
    if ensemble:
        summary["job"] += f" (an ensemble of {len(specs)} models)"

    beam = TRANSLATION.beam_size
    # Per member (key None: the one model of a single-model job).
    member_runs, trainings, weights, val_scores = [], {}, {}, {}
    for number, (member, settings) in enumerate(specs, 1):
        directory = run_dir / MEMBERS / member if member else run_dir  # runs.ensemble's layout
        which = f" member {number}/{len(specs)} ({member})" if member else ""
        config = make_config(None, src_lang=src_lang, tgt_lang=tgt_lang,
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
        model, weights[member], val_scores[member] = _choose_weights(
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
    alpha, alpha_scores = _choose_alpha(model, tokenizer, config, dev_sources[:VAL_SENTENCES],
                                        dev_references[:VAL_SENTENCES], beam)
    summary["alpha"] = alpha
    summary["val_beam_sacrebleu_by_alpha"] = {str(a): v for a, v in alpha_scores.items()}
    print(f"chosen: alpha {alpha}", flush=True)

    print(f"== 3/5 test2016 with beam {beam}, alpha {alpha}", flush=True)
    translator = Translator(model, tokenizer, beam_size=beam, alpha=alpha,
                            max_input_length=config.max_length)
    # The quick job decodes test2016 only (val was used, greedy, to choose the weights).
    splits = (("dev", "val"), ("test", "test2016")) if full else (("test", "test2016"),)
    for split, key in splits:
        sources, references = texts[split]
        with progress_bar(total=len(sources), unit=" sentences",
                          desc=f"{key} beam {beam}") as bar:
            hypotheses = translator.translate(sources, progress=bar)
        write_lines(top.hypotheses_path(key, beam), hypotheses)
        official = datasets.official_tokenized_references(config.dataset, split,
                                                          config.tgt_lang, config.source_dir)
        result = score(hypotheses, references, lang=config.tgt_lang,
                       tokenized_references=official)
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
    return (f"  training: step {step}{resumed} in {training.get('seconds', 0) / 60:.1f} min "
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
                              max_input_length=config.max_length)
    summary["saved_model"] = str(path)
    print(f"exported to {path}", flush=True)

    print("== 5/5 example translations through the exported SavedModel", flush=True)
    loaded = tf.saved_model.load(str(path))
    outputs = loaded.serve(tf.constant(EXAMPLES), beam_size=tf.constant(beam),
                           alpha=tf.constant(alpha, tf.float32))["translations"].numpy()
    for source, output in zip(EXAMPLES, outputs):
        summary["examples"][source] = output.decode("utf-8")
        print(f"  {source}\n    -> {output.decode('utf-8')}", flush=True)
