"""The main job, end to end on Multi30k, for one pair or several: vocabulary, training,
checkpoint averaging, length penalty and repetition controls chosen on val, test2016 with
beam 4, SavedModel and CTranslate2 int8 exports, example translations, a summary.

    keras-transformer demo                      # quick: 1,200 steps of a 2-layer model
    keras-transformer demo --full               # full: an ensemble of three 5,500-step models
    keras-transformer demo --tgt-lang fr        # the same for English -> French (full: one model)
    keras-transformer demo --tgt-lang de fr cs  # one model for the three pairs

The quick run (`make demo`) trains the recipe (settings below) with 2 layers and no dropout for
1,200 optimizer steps. The full run keeps the 3-layer model for 5,500 steps with P_drop 0.3
(en-fr: 0.2); for en-de it trains two more models into the ensemble's member directories and
decodes the three as an ensemble (ENSEMBLE_BY_TARGET). Each member's weights are chosen on val
alone, then the ensemble's alpha and repetition controls; docs/results.md has the sweeps.
Both recipes are bounded by steps, not by the clock, so every machine trains the same recipe
(a slower machine takes longer), in mixed_bfloat16 where the CPU has bf16 and in float32
elsewhere (`precision: auto`). Every choice the job makes is made on val and saved in the run
(`decoding.decoder.Decoder.save_choice`), so that translate, evaluate and export decode as the
job did; test2016 is decoded once, at the end, and only reported.

Several targets train one model for every pair with the quick recipe and as many times its
optimizer steps as it has pairs (the compute of that many bilingual demos); checkpoints and dev
evaluations come every that many times the bilingual recipe's steps, so that the averaging
candidates span the same share of training. The weights and search are chosen on the first
VAL_SENTENCES val sentences of every pair together (each tagged with its target), one choice
for the model; test2016 is reported per pair, in one table, with the share of outputs in
another language than asked (`evaluation.language_id`, py3langid over the run's languages).

The exports go through `export.export_run` with the run's saved choice, as `keras-transformer
export` would: the SavedModel (its `target_language` input: every pair), through which the
examples are translated, and the CTranslate2 int8 folder for `translate --engine ctranslate2`
(said how to add where the ctranslate2 package is missing; an ensemble has none)."""

import dataclasses
import logging
import pathlib
import time

from keras_transformer.decoding.request import DEFAULTS, EVALUATE, EXPORT
from keras_transformer.defaults import EXPORT_DIR, MAX_LENGTH, TRAIN_TOKENS_PER_BATCH, VOCAB_SIZE
from keras_transformer.tasks.tuning import (AVERAGE_CANDIDATES, ALPHAS, VAL_SENTENCES,  # noqa: F401
                                           choose_alpha, choose_search, choose_weights)

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
    """The settings the job trains with: QUICK, or FULL with its changes for `tgt_lang`; for
    several targets (a list), the quick recipe with its steps, checkpoints and evaluations
    scaled by their number."""
    if isinstance(tgt_lang, str) or len(tgt_lang) == 1:
        target = tgt_lang if isinstance(tgt_lang, str) else tgt_lang[0]
        return dict(FULL, **FULL_BY_TARGET.get(target, {})) if full else dict(QUICK)
    if full:
        from keras_transformer.errors import ConfigError

        raise ConfigError("--full has no multilingual recipe yet: leave it out (the quick "
                          "recipe, times the number of pairs).")
    scale = len(tgt_lang)
    return dict(QUICK, tgt_lang=list(tgt_lang), train_steps=QUICK["train_steps"] * scale,
                checkpoint_steps=QUICK["checkpoint_steps"] * scale,
                eval_steps=QUICK["eval_steps"] * scale)


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
    """Runs the main job into `tgt_lang` (a language, or a list of several: one model for
    every pair); returns the summary dict (also written to RUN_DIR/summary.json).

    `settings`: more training settings for every model it trains, e.g. `prepared_data` and
    `source_dir` where the corpus is carried prepared (benchmarks/gpu_check.py), a tiny
    `preset` in tests."""
    import keras

    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.models import Ensemble
    from keras_transformer.runs import EnsembleRun, Run, make_config
    from keras_transformer.training.trainer import train
    from pipelines.multilingual import tagged

    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    targets = [tgt_lang] if isinstance(tgt_lang, str) else list(tgt_lang)
    several = len(targets) > 1
    tgt_lang = targets if several else targets[0]
    mode = "full" if full else "quick"
    specs = members(full, tgt_lang)
    extra = dict(settings or {}, **({} if train_steps is None else {"train_steps": train_steps}))
    specs = [(name, dict(member, tgt_lang=tgt_lang, **extra)) for name, member in specs]
    name = f"multi30k-{src_lang}-{'+'.join(targets)}-{mode}"
    run_dir = pathlib.Path(output_dir or pathlib.Path("runs") / name)
    started = time.monotonic()
    job = (f"Multi30k {src_lang}->{', '.join(targets)}, one model, quick recipe x "
           f"{len(targets)}" if several else f"Multi30k {src_lang}->{tgt_lang}, {mode} recipe")
    summary = {"job": job, "run_dir": str(run_dir)}
    ensemble = len(specs) > 1
    if ensemble:
        summary["job"] += f" (an ensemble of {len(specs)} models)"

    beam = DEFAULTS["beam_size"]
    # Per member (key None: the one model of a single-model job).
    member_runs, trainings, weights, val_scores = [], {}, {}, {}
    for number, (member, settings) in enumerate(specs, 1):
        directory = EnsembleRun.member_directory(run_dir, member) if member else run_dir
        which = f" member {number}/{len(specs)} ({member})" if member else ""
        pairs = f", {len(targets)} pairs" if several else ""
        config = make_config(None, origin="recipe", src_lang=src_lang,
                             output_dir=str(directory), **settings)
        member_run = Run(directory)
        print(f"== 1/5 training{which} ({mode}: {settings['train_steps']} optimizer steps"
              f"{pairs}) -> {directory}", flush=True)
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

    tagged_val = " (every pair's first sentences, tagged)" if several else ""
    print(f"== 2/5 choosing on val{tagged_val}: the weights (final, or an average of "
          f"checkpoints){' of each member' if ensemble else ''}, then the length penalty and "
          "the repetition controls", flush=True)
    texts = pair_texts(config)  # each split read once
    dev_sources = [tagged(source, target) if several else source for target in targets
                   for source in texts[target]["dev"][0][:VAL_SENTENCES]]
    dev_references = [reference for target in targets
                      for reference in texts[target]["dev"][1][:VAL_SENTENCES]]
    models = []
    for (member, _), member_run in zip(specs, member_runs):
        if member:
            print(f"  member {member}:", flush=True)
        model, weights[member], val_scores[member] = choose_weights(
            member_run, dev_sources, dev_references)
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
    search, figures = choose_search(model, tokenizer, config.max_length, dev_sources,
                                    dev_references, beam)  # alpha, then the repetition controls
    summary.update(figures)
    alpha, repetition = search["alpha"], figures["repetition"]
    # The run remembers the choices: translate, evaluate and export decode as the job does.
    chosen_by = (f"keras-transformer demo on val (first {VAL_SENTENCES} sentences"
                 f"{' of every pair' if several else ''})")
    Decoder.save_choice(top, beam_size=beam, chosen_by=chosen_by, **search,
                        **({"weights": chosen} if ensemble else
                           {"weights": chosen, "model": top.averaged_path.name}))
    print(f"chosen: alpha {alpha}, repetition {repetition} -> {top.decoding_path}", flush=True)

    print(f"== 3/5 test2016 with beam {beam}, alpha {alpha}{', per pair' if several else ''}",
          flush=True)
    # The run's choice, just saved, decodes the model in memory.
    engine = Decoder.resolve(top, command=EVALUATE).engine(model, tokenizer, config.max_length)
    if several:
        summary["test2016"] = {target: evaluate_pair(engine, top, config, target, texts[target],
                                                     beam, several=True)
                               for target in targets}
    else:  # the quick job decodes test2016 only (val was used, greedy, to choose the weights)
        for split, key in (("dev", "val"), ("test", "test2016")) if full else (
                ("test", "test2016"),):
            summary[key] = evaluate_pair(engine, top, config, tgt_lang, texts[tgt_lang], beam,
                                         split, key)

    summary["examples"] = {}
    ctranslate2 = None
    if keras.backend.backend() == "tensorflow":
        ctranslate2 = _export_and_show(summary, top, export_dir, name, targets, several)
    else:
        print(f"== 4/5 exports: skipped (Keras runs on {keras.backend.backend()}; a "
              f"SavedModel is TensorFlow's): export the run later with KERAS_BACKEND=tensorflow "
              f"keras-transformer export --run-dir {run_dir}", flush=True)
        print("== 5/5 example translations (in process)", flush=True)
        for target in targets:
            _show_examples(summary, target if several else None, engine.translate(
                EXAMPLES, target_language=target if several else None))

    summary["job_minutes"] = round((time.monotonic() - started) / 60, 1)
    top.write_json(SUMMARY, summary)
    print("\n== summary", flush=True)
    print(f"  {summary['job']}; preset {config.preset} ({model.count_params():,} parameters)")
    for member, training in trainings.items():
        if training:
            line = _training_line(training)
            print(f"  {member}: {line.strip()}" if member else line)
    print(f"  weights: {chosen}; alpha {alpha}; repetition controls {repetition} (chosen on val)")
    if several:
        print(f"  test2016, beam {beam}:\n" + pair_table(summary["test2016"]))
    for key in () if several else ("val", "test2016"):
        if key in summary:
            result = summary[key]
            print(f"  {key}: sacreBLEU {result['sacrebleu']:.2f} (chrF {result['chrf']:.2f}), "
                  f"beam {beam}; {result['sacrebleu_signature']}")
            print(f"  {key}: BLEU {result['literature_bleu']:.2f} in the Multi30k literature "
                  f"convention (lowercased, Moses-tokenized, {result['literature_references']}"
                  " references)")
    print(f"  SavedModel: {summary.get('saved_model', 'not exported (see step 4/5)')}")
    if ctranslate2:
        print(f"  CTranslate2 int8: {ctranslate2}")
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


def pair_texts(config):
    """{target: {"dev": (sources, references), "test": (...)}} of every pair (untagged)."""
    from pipelines import datasets

    return {pair.tgt_lang: {split: datasets.split_texts(
        config.dataset, split, **config.data_arguments(pair.tgt_lang))
        for split in ("dev", "test")} for pair in config.data.pairs()}


def evaluate_pair(engine, run, config, target, texts, beam, split="test", key="test2016",
                  several=False):
    """One split of one pair decoded and scored (the hypotheses written to
    RUN_DIR/hyp.KEY.beamK[.LANG].txt); of a run of `several` targets, also the share of
    hypotheses in another language than `target`."""
    from keras_transformer.evaluation.evaluate import evaluate_split
    from keras_transformer.evaluation.language_id import wrong_language_share
    from pipelines import datasets

    sources, references = texts[split]
    if several:
        engine.set_languages(dataclasses.replace(engine.languages, default=target))
    output = run.hypotheses_path(key, beam, target if several else None)
    official = datasets.official_tokenized_references(config.dataset, split, target,
                                                      config.source_dir)
    result = evaluate_split(engine, sources, references, lang=target,
                            official_references=official, output=output,
                            desc=f"{key} {target}" if several else f"{key} beam {beam}")
    scores = {k: result[k] for k in ("sacrebleu", "chrf", "tokenized_bleu", "literature_bleu",
                                     "literature_references", "sacrebleu_signature")}
    if not several:
        print(f"{key}: " + "\n  ".join(result["lines"]), flush=True)
        return scores
    hypotheses = output.read_text(encoding="utf-8").splitlines()
    languages = {config.pair(target).src_lang, *config.target_languages}
    share, found = wrong_language_share(hypotheses, target, languages)
    print(f"{config.pair(target).name}: " + "\n  ".join(result["lines"])
          + f"\n  wrong language: {100 * share:.2f}% ({found})", flush=True)
    return {**scores, "wrong_language": round(share, 4), "languages_found": found}


def pair_table(results):
    """One line per pair: sacreBLEU, chrF, literature BLEU, wrong-language share."""
    lines = [f"  {'pair':<8} {'sacreBLEU':>9} {'chrF':>6} {'lit. BLEU':>9} {'wrong lang.':>11}"]
    for target, result in results.items():
        lines.append(f"  {target:<8} {result['sacrebleu']:>9.2f} {result['chrf']:>6.2f} "
                     f"{result['literature_bleu']:>9.2f} "
                     f"{100 * result['wrong_language']:>10.2f}%")
    return "\n".join(lines)


def _show_examples(summary, target, outputs):
    """The examples' translations into `target` (None: the run's one target) in the summary
    and on screen."""
    if target is None:
        summary["examples"].update(zip(EXAMPLES, outputs))
    else:
        summary["examples"][target] = list(outputs)
    for source, output in zip(EXAMPLES, outputs):
        print(f"  {f'[{target}] ' if target else ''}{source}\n    -> {output}", flush=True)


def _export_and_show(summary, run, export_dir, name, targets, several):
    """Steps 4 and 5 on TensorFlow: the exports of the run's saved choice (`export_run`), and
    the examples through the SavedModel, into every target; the CTranslate2 folder or None."""
    import tensorflow as tf
    from absl import logging as absl_logging

    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.export import export_run

    absl_logging.set_verbosity(absl_logging.WARNING)
    decoder = Decoder.resolve(run, command=EXPORT)
    print(f"== 4/5 SavedModel export -> {export_dir}/{name}/", flush=True)
    path = export_run(decoder, output_dir=export_dir, name=name)
    summary["saved_model"] = str(path)
    print(f"exported to {path}", flush=True)
    folder = export_ctranslate2(decoder, export_dir, name, targets[0] if several else None)

    print("== 5/5 example translations through the exported SavedModel"
          f"{', every language' if several else ''}", flush=True)
    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    request = decoder.request
    for target in targets if several else [None]:
        inputs = dict(sentences=tf.constant(EXAMPLES), beam_size=tf.constant(request.beam_size),
                      alpha=tf.constant(request.alpha, tf.float32),
                      prefixes=tf.constant([], tf.string), constraints=tf.constant([], tf.string),
                      no_repeat_ngram_size=tf.constant(request.no_repeat_ngram_size),
                      repetition_penalty=tf.constant(request.repetition_penalty, tf.float32))
        if target:
            inputs["target_language"] = tf.constant([target])
        outputs = serve(**inputs)["translations"].numpy()
        _show_examples(summary, target, [output.decode("utf-8") for output in outputs])
    return folder


def export_ctranslate2(decoder, export_dir, name, target_language=None):
    """The run's CTranslate2 int8 export (`export_run`, replacing an earlier one) into its
    default int8 folder, and the command that translates with it; without the ctranslate2
    package, how to add it. Returns the folder, or None (no package; an ensemble)."""
    from keras_transformer.errors import InputError
    from keras_transformer.export import ct2, export_run
    from keras_transformer.runs import EnsembleRun

    if isinstance(decoder.run, EnsembleRun):  # (it exports as one SavedModel only)
        print("CTranslate2 export: none for an ensemble.", flush=True)
        return None
    try:
        ct2.require_ctranslate2()
    except InputError as error:
        print(f"CTranslate2 export: skipped. {error}", flush=True)
        return None
    print(f"CTranslate2 int8 export -> {export_dir}/{name}/", flush=True)
    folder = export_run(decoder, format="ctranslate2", quantize="int8", output_dir=export_dir,
                        name=name, overwrite=True)
    language = f" --tgt-lang {target_language}" if target_language else ""
    print(f"exported to {folder}; translate with it:\n  keras-transformer translate --run-dir "
          f"{decoder.run.directory} --engine ctranslate2 --ctranslate2-model {folder}"
          f"{language} < input.txt", flush=True)
    return folder
