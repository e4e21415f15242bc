"""The stages of a job on a run, each a function a user can call alone, in this order:

    prepare(config)                       # the training data tokenized into the data cache
    summary = train(config)               # trains (or resumes) the run; train_summary.json
    tuning = tune("runs/r")               # chooses on the run's own dev set: decoding.json
    tuning = tune("runs/r", "dev.en", "dev.de", max_sentences=300)   # on given sentences
    scores = evaluate(run)                # the run's test split: hyp.test.beam4.txt, scores
    saved_model, ct2_folder = export(run, "saved_models", "name")
    outputs = show(saved_model, decoder.request, ["A dog runs."])

`tune` is `keras-transformer tune` (and, as `tune_trained`, the end of `keras-transformer
train` and `distill`): the weights (the final ones, averages of the last checkpoints,
best.keras), then the length penalty and the repetition controls with them
(`tasks/tuning.py`), chosen on dev sentences and saved in the run with every try
(decoding.json, `runs/choices.py`), where translate, evaluate and export find them. The main
job (`tasks/main_job.py`) is these stages in a row; a distilled student (`tasks/distill.py`)
is trained and tuned by them too.
"""

import contextlib
import dataclasses
import os
import sys

from keras_transformer.decoding.request import DEFAULTS
from keras_transformer.errors import ConfigError, InputError, RunError
from keras_transformer.tasks.tuning import VAL_SENTENCES

TRAIN_SUMMARY = "train_summary.json"  # the training summary a trained run keeps (`train`)


def prepare(config, check=False):
    """The run's training data tokenized into the data cache, as `train` would prepare them
    first (a run that has a vocabulary keeps it); nothing to do for a config that names its
    `prepared_data`. Returns the `PreparedData`, or None."""
    from keras_transformer.runs import Run
    from pipelines import datasets

    if config.prepared_data:
        return None
    return datasets.prepare_training_data(
        config.dataset, **config.prepared_data_arguments(),
        vocabulary=Run(config.output_dir).vocabulary_bytes(), progress=config.verbose > 0,
        verify=check)


def train(config, continue_stopped=False, callbacks=()):
    """Trains (or resumes) the run `config` describes (`training.trainer.train`); a run that
    trained keeps its summary in RUN_DIR/train_summary.json. Returns the summary."""
    from keras_transformer.runs import Run
    from keras_transformer.training.trainer import train as fit

    summary = fit(config, continue_stopped=continue_stopped, callbacks=callbacks)
    if "model" in summary:  # it trained and saved its model (else: nothing to do, stopped)
        Run(config.output_dir).write_json(TRAIN_SUMMARY, summary)
    return summary


@dataclasses.dataclass(frozen=True)
class DevSet:
    """The dev sentences a tuning decodes: sources (tagged with their target in a run of
    several pairs), references, and what they are, in words."""
    sources: list
    references: list
    described: str


def dev_set(run, sources=None, references=None, target_language=None,
            max_sentences=VAL_SENTENCES):
    """The `DevSet` of `run`: the given `sources` and `references` (lists of strings, or
    files of one sentence a line), else the run's own dev set (every pair's, or the pair into
    `target_language`); at most the first `max_sentences` (None or 0: all) of each pair.
    InputError or ConfigError says what is missing or does not match."""
    from pipelines.multilingual import tagged

    config, limit = run.config, max_sentences or None
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise InputError(f"max_sentences={max_sentences!r} must be a whole number of "
                         "sentences (0: all).")
    pairs = config.data.pairs()
    tag = (lambda text, pair: text) if len(pairs) == 1 else (
        lambda text, pair: tagged(text, pair.tgt_lang))
    if sources is None and references is None:
        chosen = pairs if target_language is None else [config.pair(target_language)]
        texts = {pair: _own_dev(config, pair, limit) for pair in chosen}
        counts = [len(srcs) for srcs, _ in texts.values()]
        said = (f"the first {limit} sentences" if limit in counts else
                f"{'/'.join(map(str, counts))} sentences")
        return DevSet([tag(s, pair) for pair, (srcs, _) in texts.items() for s in srcs],
                      [r for _, refs in texts.values() for r in refs],
                      f"the run's dev set ({', '.join(pair.name for pair in chosen)}: {said}"
                      f"{' of each' if len(chosen) > 1 else ''})")
    if sources is None or references is None:
        raise InputError("give both the dev sources and their references (--src and --ref).")
    if len(pairs) > 1 and target_language is None:
        raise ConfigError(f"this run translates into {', '.join(p.tgt_lang for p in pairs)}: "
                          "say which language the references are in (--tgt-lang).")
    pair = config.pair(target_language)
    names = [str(side) for side in (sources, references) if isinstance(side, (str, os.PathLike))]
    sources, references = _given(sources, references)
    said = f"the first {limit}" if limit and limit < len(sources) else f"the {len(sources)}"
    files = f" of {names[0]} / {names[1]}" if len(names) == 2 else ""
    return DevSet([tag(s, pair) for s in sources[:limit]], references[:limit],
                  f"{said} sentences{files} ({pair.name})")


def _own_dev(config, pair, limit):
    from pipelines import datasets

    where = config.data_arguments(pair.tgt_lang if config.target_languages else None)
    if not datasets.has_split(config.dataset, "dev", **where):
        raise InputError(f"the run has no dev set ({pair.name} was trained without "
                         "--dev-src/--dev-tgt): give dev sentences and their references "
                         "(--src and --ref).")
    return datasets.split_texts(config.dataset, "dev", limit=limit, **where)


def _given(sources, references):
    """Two line-aligned lists of the given sentences (files read as UTF-8, checked first)."""
    from keras_transformer.decoding.jobs.textio import read_lines
    from keras_transformer.tasks.evaluate_job import check_files

    if isinstance(sources, (str, os.PathLike)):
        check_files(sources, references)
        return read_lines(sources), read_lines(references)
    sources, references = list(sources), list(references)
    if len(sources) != len(references) or not sources:
        raise InputError(f"{len(sources)} dev sources for {len(references)} references: give "
                         "one reference per source, at least one.")
    return sources, references


@dataclasses.dataclass(frozen=True)
class Tuning:
    """What `tune` chose: the model in memory (an `Ensemble` for an ensemble run), the weights
    of each member ({name: label}; {None: label} for one model), their greedy dev sacreBLEU
    ({name: {label: BLEU}}), the search's figures (`tuning.choose_search`), and the choice
    as saved (decoding.json's content)."""
    model: object
    weights: dict
    weight_scores: dict
    figures: dict
    choice: dict


def tune(run, sources=None, references=None, *, target_language=None,
         max_sentences=VAL_SENTENCES, beam_size=DEFAULTS["beam_size"], chosen_by=None,
         name="dev", progress=True):
    """Chooses the run's weights (each member's, in an ensemble), then its length penalty and
    repetition controls with the beam, on dev sentences, and saves the choice with every try
    in RUN_DIR/decoding.json; the chosen weights go to averaged.keras.

    Args:
        run: a `Run`, an `EnsembleRun`, or a run directory; trained.
        sources, references: the dev sentences and their references (lists, or files of one
            sentence a line); None: the run's own dev set (`dev_set`). `sources` may be a
            `DevSet` instead, taken as it is (tagged, cut).
        target_language: a run of several pairs: the pair of the given sentences (default:
            with the run's own dev set, every pair's sentences together).
        max_sentences: at most this many first sentences (of each pair); None or 0: all.
        beam_size: the beam the length penalty and the controls are chosen for (saved too).
        chosen_by: who chose them, as decoding.json says (default: `keras-transformer tune`
            and which sentences).
        name: what the printed lines call the sentences ("dev", "val").
        progress: a bar over the whole tuning on standard error, in sentences decoded.

    Returns:
        a `Tuning`.
    """
    from keras_transformer.runs import open_run

    run = open_run(run) if isinstance(run, (str, os.PathLike)) else run
    if not run.has_model():
        raise RunError(f"{run.directory} has no trained model to tune: train it first.")
    dev = sources if isinstance(sources, DevSet) else dev_set(
        run, sources, references, target_language, max_sentences)
    if not any(dev.sources):
        raise InputError(f"{dev.described} has no sentence to decode: give dev sentences.")
    writes = {run.directory: run}  # the run, and an ensemble's members (their averaged.keras)
    writes.update((member.directory, member) for member in _members(run).values())
    with contextlib.ExitStack() as held:
        for each in writes.values():
            held.enter_context(each.lock("tuning"))
        bar = held.enter_context(_bar(run, dev, progress))
        return _tune(run, dev, beam_size, chosen_by or f"keras-transformer tune on "
                     f"{dev.described}", name, bar)


def _members(run):
    """{name: member run} of an ensemble; {None: run} for one model."""
    return {member.directory.name: member for member in run.members} if hasattr(
        run, "members") else {None: run}


def _bar(run, dev, progress):
    from keras_transformer.tasks.tuning import beam_searches, weight_candidates
    from pipelines.progress import progress_bar

    # In sentences decoded, a try's sentence one unit whatever its search: on the demo run
    # (500 val sentences, 2 loaded cores) a greedy try, its weights loaded and averaged, took
    # about 45 s and a beam-4 try, its search traced, about 30 s.
    greedy = sum(len(weight_candidates(member)) for member in _members(run).values())
    sentences = sum(1 for source in dev.sources if source)
    return progress_bar(total=sentences * (greedy + beam_searches()), unit=" sentences",
                        desc="tune", disable=not progress)


def _tune(run, dev, beam, chosen_by, name, bar):
    """`tune` under the run's locks, with its bar."""
    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.models import Ensemble
    from keras_transformer.tasks import tuning

    def say(line):
        bar.write(line, file=sys.stdout)
        sys.stdout.flush()

    said = dict(progress=bar, name=name, say=say)
    members, models, weights, scores = _members(run), [], {}, {}
    for member, member_run in members.items():
        if member:
            say(f"  member {member}:")
        model, weights[member], scores[member] = tuning.choose_weights(
            member_run, dev.sources, dev.references, **said)
        averaged = member_run.save_model(model, averaged=True)
        say(f"chosen{f' for {member}' if member else ''}: {weights[member]} -> {averaged}")
        models.append(model)
    model = models[0] if None in members else Ensemble(models)
    search, figures = tuning.choose_search(model, run.vocabulary(), run.config.max_length,
                                           dev.sources, dev.references, beam, **said)
    label = weights[None] if None in members else "; ".join(
        f"{member}: {chosen}" for member, chosen in weights.items())
    where = {"model": run.averaged_path.name} if None in members else {}
    choice = Decoder.save_choice(run, beam_size=beam, chosen_by=chosen_by, **search,
                                 weights=label, **where,
                                 tries=tuning.tries(scores, figures, beam))
    say(f"chosen: alpha {search['alpha']}, repetition {figures['repetition']} -> "
        f"{run.decoding_path}")
    return Tuning(model, weights, scores, figures, choice)


def tune_trained(run, trained, progress=True):
    """The `tune` stage on the run's dev set after its training (`train` and `distill` end
    with it): said, and skipped where the run has no dev set or a tuned choice that no
    training has changed since (`trained`: this training saved a model)."""
    import logging

    from keras_transformer.runs.choices import TRIES
    from pipelines import datasets

    config = run.config
    if not datasets.has_split(config.dataset, "dev", **config.data_arguments()):
        print("tune: no dev set, so the run decodes with the defaults (keras-transformer tune "
              f"--run-dir {run.directory} --src DEV.src --ref DEV.tgt chooses on given "
              "sentences)", flush=True)
        return None
    if not trained and TRIES in run.decoding():
        print(f"tune: {run.decoding_path} holds a choice made since the last training "
              f"(keras-transformer tune --run-dir {run.directory} makes it again)", flush=True)
        return None
    logging.getLogger("tensorflow").setLevel(logging.ERROR)  # each search traced: meant
    each = " of each pair" if config.target_languages else ""
    print(f"tune: choosing the weights, alpha and repetition controls on the run's dev set "
          f"(the first {VAL_SENTENCES} sentences{each}; --no-tune skips this)", flush=True)
    return tune(run, progress=progress)


def evaluate(run, texts=None, engine=None, split="test", key=None, target=None):
    """One split of one pair decoded and scored: `texts` ({split: (sources, references)},
    untagged; default: the run's own split) with `engine` (default: the run's, with its saved
    choice), the hypotheses written to RUN_DIR/hyp.KEY.beamK[.LANG].txt (KEY: default the
    split). `target`: the pair's language in a run of several (None for one pair): its scores
    then also say the share of hypotheses in another language. Returns the scores."""
    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.decoding.request import EVALUATE
    from keras_transformer.evaluation.evaluate import evaluate_split
    from keras_transformer.evaluation.language_id import wrong_language_share
    from pipelines import datasets

    config, key = run.config, key or split
    texts = texts or {split: datasets.split_texts(config.dataset, split,
                                                  **config.data_arguments(target))}
    engine = engine or Decoder.resolve(run, command=EVALUATE).engine()
    sources, references = texts[split]
    if target is not None:
        engine.set_languages(dataclasses.replace(engine.languages, default=target))
    beam, lang = engine.beam_size, target or config.tgt_lang
    output = run.hypotheses_path(key, beam, target)
    official = datasets.official_tokenized_references(config.dataset, split, lang,
                                                      config.source_dir)
    result = evaluate_split(engine, sources, references, lang=lang,
                            official_references=official, output=output,
                            desc=f"{key} {target}" if target else f"{key} beam {beam}")
    scores = {k: result[k] for k in ("sacrebleu", "chrf", "tokenized_bleu", "literature_bleu",
                                     "literature_references", "sacrebleu_signature")}
    if target is None:
        print(f"{key}: " + "\n  ".join(result["lines"]), flush=True)
        return scores
    hypotheses = output.read_text(encoding="utf-8").splitlines()
    languages = {config.pair(target).src_lang, *config.target_languages}
    share, found = wrong_language_share(hypotheses, target, languages)
    print(f"{config.pair(target).name}: " + "\n  ".join(result["lines"])
          + f"\n  wrong language: {100 * share:.2f}% ({found})", flush=True)
    return {**scores, "wrong_language": round(share, 4), "languages_found": found}


def export(run, export_dir, name, target_language=None):
    """The run's SavedModel and CTranslate2 int8 exports with its saved choice
    (`export.export_run`, as `keras-transformer export` makes them), replacing earlier ones.
    Returns (the SavedModel's path, the CTranslate2 folder or None: no ctranslate2 package,
    an ensemble)."""
    from absl import logging as absl_logging

    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.decoding.request import EXPORT
    from keras_transformer.export import export_run

    absl_logging.set_verbosity(absl_logging.WARNING)
    decoder = Decoder.resolve(run, command=EXPORT)
    print(f"SavedModel export -> {export_dir}/{name}/", flush=True)
    path = export_run(decoder, output_dir=export_dir, name=name)
    print(f"exported to {path}", flush=True)
    return path, export_ctranslate2(decoder, export_dir, name, target_language)


def export_ctranslate2(decoder, export_dir, name, target_language=None):
    """The run's CTranslate2 int8 export (`export_run`, replacing an earlier one) into its
    default int8 folder, and the command that translates with it; without the ctranslate2
    package, how to add it. Returns the folder, or None (no package; an ensemble)."""
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


def show(saved_model, request, sentences, target_language=None):
    """`sentences` translated through an exported SavedModel's `serving_default` with the
    search of `request` (a `decoding.request.Request`: beam, alpha, repetition controls);
    into `target_language` for a model of several pairs. Returns the translations."""
    import tensorflow as tf

    serve = tf.saved_model.load(str(saved_model)).signatures["serving_default"]
    inputs = dict(sentences=tf.constant(sentences), beam_size=tf.constant(request.beam_size),
                  alpha=tf.constant(request.alpha, tf.float32),
                  prefixes=tf.constant([], tf.string), constraints=tf.constant([], tf.string),
                  no_repeat_ngram_size=tf.constant(request.no_repeat_ngram_size),
                  repetition_penalty=tf.constant(request.repetition_penalty, tf.float32))
    if target_language:
        inputs["target_language"] = tf.constant([target_language])
    return [output.decode("utf-8") for output in serve(**inputs)["translations"].numpy()]
