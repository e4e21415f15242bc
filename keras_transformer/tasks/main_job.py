"""The main job, end to end on Multi30k, for one pair or several: the stages of
`tasks/stages.py` in a row (STAGES: prepare the data, train, tune on val, evaluate test2016
with beam 4, export a SavedModel and a CTranslate2 int8 folder, show example translations),
then a summary.

    keras-transformer demo                      # quick: 1,200 steps of a 2-layer model
    keras-transformer demo --full               # full: an ensemble of three 5,500-step models
    keras-transformer demo --tgt-lang fr        # the same for English -> French (full: one model)
    keras-transformer demo --tgt-lang de fr cs  # one model for the three pairs

The quick run (`make demo`) trains the recipe (tasks/recipes.py) with 2 layers and no dropout for
1,200 optimizer steps. The full run keeps the 3-layer model for 5,500 steps with P_drop 0.3
(en-fr: 0.2); for en-de it trains two more models into the ensemble's member directories and
decodes the three as an ensemble (ENSEMBLE_BY_TARGET). Each member's weights are chosen on val
alone, then the ensemble's alpha and repetition controls; docs/results.md has the sweeps.
Both recipes are bounded by steps, not by the clock, so every machine trains the same recipe
(a slower machine takes longer), in mixed_bfloat16 where the CPU has bf16 and in float32
elsewhere (`precision: auto`). Every choice the job makes is made on val by the `tune` stage
and saved in the run (decoding.json, with every try), so that translate, evaluate and export
decode as the job did; test2016 is decoded once, at the end, and only reported.

Several targets train one model for every pair with the quick recipe and as many times its
optimizer steps as it has pairs (the compute of that many bilingual demos); checkpoints and dev
evaluations come every that many times the bilingual recipe's steps, so that the averaging
candidates span the same share of training. The weights and search are chosen on the first
VAL_SENTENCES val sentences of every pair together (each tagged with its target), one choice
for the model; test2016 is reported per pair, in one table, with the share of outputs in
another language than asked (`evaluation.language_id`, py3langid over the run's languages).
What differs between one pair and several is one table (SHAPES).

The exports go through `export.export_run` with the run's saved choice, as `keras-transformer
export` would: the SavedModel (its `target_language` input: every pair), through which the
examples are translated, and the CTranslate2 int8 folder for `translate --engine ctranslate2`
(said how to add where the ctranslate2 package is missing; an ensemble has none)."""

import dataclasses
import logging
import pathlib
import time

from keras_transformer.decoding.request import DEFAULTS, EVALUATE, EXPORT
from keras_transformer.defaults import EXPORT_DIR
from keras_transformer.tasks import stages
from keras_transformer.tasks.recipes import (  # noqa: F401
    COMMON, ENSEMBLE_BY_TARGET, FULL, FULL_BY_TARGET, QUICK, RECIPE, RECIPES, TEST, VAL, Recipe,
    _targets, members, recipe)
from keras_transformer.tasks.stages import TRAIN_SUMMARY, export_ctranslate2  # noqa: F401
from keras_transformer.tasks.tuning import (AVERAGE_CANDIDATES, ALPHAS, VAL_SENTENCES,  # noqa: F401
                                           choose_alpha, choose_search, choose_weights)

log = logging.getLogger(__name__)

# What a finished member run must have been trained with for the job to use it as is.
MEMBER_CHECKS = ("train_steps", "vocab_size", "tokens_per_batch", "warmup_steps", "dataset",
                 "src_lang", "tgt_lang")
SUMMARY = "summary.json"  # the file the job adds to the run (and TRAIN_SUMMARY per model)
EXAMPLES = ["A little girl climbs into a wooden playhouse.",
            "Two men are playing chess in the park.",
            "A dog is running through the snow."]
BEAM = DEFAULTS["beam_size"]



@dataclasses.dataclass(frozen=True)
class Shape:
    """What the job says and reports differently for one pair and for several pairs (one
    model for every pair); `{...}` fields are filled by `plan`."""
    job: str          # the job's name in the summary
    pairs: str        # after the optimizer steps of the training line
    val: str          # what the val sentences are, in decoding.json's chosen_by
    tagged: str       # the same, in the tuning's headline
    per_pair: str     # in test2016's headline
    examples: str     # in the examples' headline
    report: object    # prints test2016 (and val) in the summary: a function of the summary


def _report_splits(summary):
    for key in ("val", "test2016"):
        if key in summary:
            result = summary[key]
            print(f"  {key}: sacreBLEU {result['sacrebleu']:.2f} (chrF {result['chrf']:.2f}), "
                  f"beam {BEAM}; {result['sacrebleu_signature']}")
            print(f"  {key}: BLEU {result['literature_bleu']:.2f} in the Multi30k literature "
                  f"convention (lowercased, Moses-tokenized, {result['literature_references']}"
                  " references)")


def _report_pairs(summary):
    print(f"  test2016, beam {BEAM}:\n" + pair_table(summary["test2016"]))


SHAPES = {
    False: Shape(job="Multi30k {src}->{targets}, {mode} recipe", pairs="", val="", tagged="",
                 per_pair="", examples="", report=_report_splits),
    True: Shape(job="Multi30k {src}->{targets}, one model, quick recipe x {count}",
                pairs=", {count} pairs", val=" of every pair",
                tagged=" (every pair's first sentences, tagged)", per_pair=", per pair",
                examples=", every language", report=_report_pairs),
}


@dataclasses.dataclass
class Job:
    """The main job as `plan` decides it, and what its stages make (the tuned model, the
    engine that evaluates it, the texts, the summary)."""
    name: str
    mode: str
    src_lang: str
    run_dir: pathlib.Path
    export_dir: str
    targets: list         # the target languages
    tags: tuple           # each pair's target as the stages take it: (None,) for one pair
    members: list         # [(name or None, settings, Run)]: the models trained
    top: object           # the run decoded: the one model's `Run`, or the `EnsembleRun`
    splits: tuple         # (split, key) evaluated per pair
    shape: Shape
    summary: dict
    texts: dict = None    # {target: {split: (sources, references)}}: `_tune` reads them
    model: object = None  # the tuned model, in memory
    engine: object = None  # the engine test2016 was decoded with


def plan(full=False, src_lang="en", tgt_lang="de", output_dir=None, export_dir=EXPORT_DIR,
         train_steps=None, settings=None):
    """The `Job` of `run`'s arguments: its name, run directory, models and what it reports."""
    from keras_transformer.runs import EnsembleRun, Run

    targets, kind = _targets(tgt_lang), RECIPES[full]
    several = len(targets) > 1
    tgt, tags, splits = (targets, tuple(targets), (TEST,)) if several else (
        targets[0], (None,), kind.splits)
    shape, mode = SHAPES[several], kind.mode
    said = dict(src=src_lang, targets=", ".join(targets), mode=mode, count=len(targets))
    shape = dataclasses.replace(shape, job=shape.job.format(**said),
                                pairs=shape.pairs.format(**said))
    extra = dict(settings or {}, **({} if train_steps is None else {"train_steps": train_steps}))
    name = f"multi30k-{src_lang}-{'+'.join(targets)}-{mode}"
    run_dir = pathlib.Path(output_dir or pathlib.Path("runs") / name)
    specs = [(member, dict(values, tgt_lang=tgt, **extra))
             for member, values in kind.members(targets)]
    runs = [Run(EnsembleRun.member_directory(run_dir, member) if member else run_dir)
            for member, _ in specs]
    top = EnsembleRun(run_dir, runs) if len(runs) > 1 else runs[0]
    job = shape.job + (f" (an ensemble of {len(runs)} models)" if len(runs) > 1 else "")
    return Job(name, mode, src_lang, run_dir, export_dir, targets, tags,
               [(member, values, run) for (member, values), run in zip(specs, runs)], top,
               splits, shape, {"job": job, "run_dir": str(run_dir)})


def run(full=False, src_lang="en", tgt_lang="de", output_dir=None, export_dir=EXPORT_DIR,
        train_steps=None, settings=None):
    """Runs the main job into `tgt_lang` (a language, or a list of several: one model for
    every pair); returns the summary dict (also written to RUN_DIR/summary.json).

    `settings`: more training settings for every model it trains, e.g. `prepared_data` and
    `source_dir` where the corpus is carried prepared (benchmarks/gpu_check.py), a tiny
    `preset` in tests."""
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    job = plan(full, src_lang, tgt_lang, output_dir, export_dir, train_steps, settings)
    started = time.monotonic()
    for number, (_, stage) in enumerate(STAGES, 1):
        stage(job, f"{number}/{len(STAGES)}")
    job.summary["job_minutes"] = round((time.monotonic() - started) / 60, 1)
    job.top.write_json(SUMMARY, job.summary)
    _report(job)
    return job.summary


def _config(job, settings, member_run):
    from keras_transformer.runs import make_config

    return make_config(None, origin="recipe", src_lang=job.src_lang,
                       output_dir=str(member_run.directory), **settings)


def _prepare(job, step):
    """Stage 1: the training data of the models still to train, tokenized once (the members
    of an ensemble share them)."""
    untrained = [(settings, run) for _, settings, run in job.members if not run.has_model()]
    print(f"== {step} preparing the training data", flush=True)
    if not untrained:
        print("every model is trained: nothing to prepare.", flush=True)
        return
    stages.prepare(_config(job, *untrained[0]).resolved())  # training says what it holds


def _train(job, step):
    """Stage 2: each model trained (a trained one is kept, checked against the recipe when it
    is an ensemble's member)."""
    trainings = {}
    for number, (member, settings, member_run) in enumerate(job.members, 1):
        which = f" member {number}/{len(job.members)} ({member})" if member else ""
        directory, config = member_run.directory, _config(job, settings, member_run)
        print(f"== {step} training{which} ({job.mode}: {settings['train_steps']} optimizer "
              f"steps{job.shape.pairs}) -> {directory}", flush=True)
        if member_run.has_model():
            print(f"{directory} holds a trained model: training is done (delete {directory} "
                  "to train again).", flush=True)
            if member:
                _check_member(member_run, config)
            trainings[member] = member_run.read_json(TRAIN_SUMMARY, default={})
        else:
            trainings[member] = stages.train(config)
    job.summary["training"] = _one_or_each(trainings)


def _one_or_each(per_member):
    """The value of the one model ({None: value}), else {member: value} as it is."""
    return per_member[None] if None in per_member else per_member


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


def _tune(job, step):
    """Stage 3: the `tune` stage on the first VAL_SENTENCES val sentences (of every pair,
    tagged with its target)."""
    from pipelines.multilingual import tagged

    each = " of each member" if len(job.members) > 1 else ""
    print(f"== {step} choosing on val{job.shape.tagged}: the weights (final, or an average of "
          f"checkpoints){each}, then the length penalty and the repetition controls",
          flush=True)
    job.texts = pair_texts(job.top.config)  # each split read once
    dev = [job.texts[target]["dev"] for target in job.targets]
    chosen_by = (f"keras-transformer demo on val (first {VAL_SENTENCES} sentences"
                 f"{job.shape.val})")
    sentences = stages.DevSet(
        [tagged(source, tag) if tag else source
         for tag, (sources, _) in zip(job.tags, dev) for source in sources[:VAL_SENTENCES]],
        [reference for _, references in dev for reference in references[:VAL_SENTENCES]],
        chosen_by)
    tuning = stages.tune(job.top, sentences, beam_size=BEAM, chosen_by=chosen_by, name="val")
    job.model = tuning.model
    job.summary.update(weights=_one_or_each(tuning.weights),
                       val_greedy_sacrebleu=_one_or_each(tuning.weight_scores), **tuning.figures)


def _evaluate(job, step):
    """Stage 4: test2016 (and val, for the full recipe of one pair) decoded with the tuned
    model in memory and the run's choice, per pair."""
    from keras_transformer.decoding.decoder import Decoder

    print(f"== {step} test2016 with beam {BEAM}, alpha {job.summary['alpha']}"
          f"{job.shape.per_pair}", flush=True)
    top = job.top
    job.engine = Decoder.resolve(top, command=EVALUATE).engine(
        job.model, top.vocabulary(), top.config.max_length)
    results = {tag: {key: stages.evaluate(top, job.texts[target], job.engine, split, key, tag)
                     for split, key in job.splits}
               for tag, target in zip(job.tags, job.targets)}
    if None in results:  # one pair: {key: scores}
        job.summary.update(results[None])
    else:
        job.summary.update({key: {tag: scores[key] for tag, scores in results.items()}
                            for _, key in job.splits})


def _export(job, step):
    """Stage 5: the SavedModel and CTranslate2 exports of the run's choice (TensorFlow)."""
    import keras

    backend = keras.backend.backend()
    if backend != "tensorflow":
        print(f"== {step} exports: skipped (Keras runs on {backend}; a SavedModel is "
              f"TensorFlow's): export the run later with KERAS_BACKEND=tensorflow "
              f"keras-transformer export --run-dir {job.run_dir}", flush=True)
        return
    print(f"== {step} exports -> {job.export_dir}/{job.name}/", flush=True)
    path, folder = stages.export(job.top, job.export_dir, job.name, job.tags[0])
    job.summary["saved_model"] = str(path)
    job.summary["ctranslate2"] = folder and str(folder)


def _show(job, step):
    """Stage 6: the examples translated into every target, through the exported SavedModel
    (else in process)."""
    from keras_transformer.decoding.decoder import Decoder

    job.summary["examples"] = {}
    saved_model = job.summary.get("saved_model")
    where = "through the exported SavedModel" if saved_model else "(in process)"
    print(f"== {step} example translations {where}{job.shape.examples}", flush=True)
    request = Decoder.resolve(job.top, command=EXPORT).request
    for tag in job.tags:
        outputs = (stages.show(saved_model, request, EXAMPLES, tag) if saved_model
                   else job.engine.translate(EXAMPLES, target_language=tag))
        _show_examples(job.summary, tag, outputs)


# The job, stage by stage: each a function of the job and its "n/N" (each prints its headline).
STAGES = (("prepare", _prepare), ("train", _train), ("tune", _tune), ("evaluate", _evaluate),
          ("export", _export), ("show", _show))


def _report(job):
    """The summary on screen."""
    summary, config = job.summary, job.top.config
    print("\n== summary", flush=True)
    print(f"  {summary['job']}; preset {config.preset} ({job.model.count_params():,} "
          "parameters)")
    for member, _, _ in job.members:
        training = summary["training"] if member is None else summary["training"][member]
        if training:
            line = _training_line(training)
            print(f"  {member}: {line.strip()}" if member else line)
    weights = summary["weights"]
    chosen = weights if isinstance(weights, str) else "; ".join(
        f"{member}: {label}" for member, label in weights.items())
    print(f"  weights: {chosen}; alpha {summary['alpha']}; repetition controls "
          f"{summary['repetition']} (chosen on val)")
    job.shape.report(summary)
    print(f"  SavedModel: {summary.get('saved_model', 'not exported (see the exports)')}")
    if summary.get("ctranslate2"):
        print(f"  CTranslate2 int8: {summary['ctranslate2']}")
    print(f"  whole job: {summary['job_minutes']} min; details in {job.top.file(SUMMARY)}",
          flush=True)


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
