"""Sequence-level knowledge distillation (Kim and Rush, 2016): a teacher translates its own
training sources, and a student trains on those translations instead of the references.

    summary = distill(["runs/multi30k-en-de-full"],           # a run, or an ensemble's
                      make_config(output_dir="runs/student"))  # the student's settings

The request (the teachers, the student's settings, the teacher's search) is resolved once,
into a `Distillation`, before anything is written: the teacher opened, its search decided, the
student's config made with the record of the teachers. Then three stages, each resumable by
running the same call again:

1. The corpus. The student's config is written first (it records the teachers), then the
   teacher's training sources (the pairs its own training read, the source side) and its dev
   set with the references are copied into the student run (`Run.distilled_path`:
   distilled/train.SRC, distilled/dev.SRC, distilled/dev.TGT), once.
2. The translation. The teacher translates distilled/train.SRC into distilled/train.TGT with
   its saved decoding choice (decoding.json: model, beam, alpha; `--beam`/`--alpha` override)
   through the file job of `translate --output` (`decoding.jobs.streaming.translate_file`):
   a killed distillation goes on after the windows done and ends with the same bytes as an
   uninterrupted one. Several teacher runs are decoded as one ensemble (the mean of their
   probabilities, `models.Ensemble`); an ensemble assembled here has no saved choice, so it
   decodes with the defaults unless `--beam`/`--alpha` say otherwise.
3. The training. The student is an ordinary run on dataset "text" (the files above) with its
   own settings: the `STUDENT_PRESET` unless a preset is given, its own vocabulary of the
   teacher's size, the teacher's languages and max_length. It is trained, resumed and then
   tuned on its dev set by the stages of every run (`tasks.stages`: `train`, then
   `tune_trained` as at the end of `keras-transformer train`).

The student's config.json records the teachers (absolute directories), the sha256 of each
decoded run's config.json and the decoding used (the `distill` section of `TrainConfig`); a
teacher whose own text files have no pair to read (`check_corpus`) is refused before it is
written. A student that resumes keeps that record: once its corpus is complete the teachers
are not opened again; while it is not, the teachers must still be the recorded ones, decoding
as recorded (RunError otherwise: a corpus is made by one teacher).
"""

import dataclasses
import os
import sys

from keras_transformer.errors import ConfigError, RunError
from keras_transformer.runs import EnsembleRun, Run, TrainConfig, open_run
from keras_transformer.runs.parent import config_digest

# The student's preset when none is given: the smallest Multi30k preset (Wu et al.'s
# Transformer-tiny: 4 + 4 layers, d_model 128, d_ff 256, 4 heads; 2.6M parameters with 10000
# pieces), a third of the Multi30k recipe's 7.6M; small students are what distillation is for.
STUDENT_PRESET = "multi30k-tiny"
# What distillation decides for the student: its data are the distilled corpus in the
# teacher's languages. No flag is generated for these; a config file that sets them is refused.
DECIDED = ("dataset", "src_lang", "tgt_lang", "train_src", "train_tgt", "dev_src", "dev_tgt",
           "data_dir", "source_dir", "prepared_data", "init_from", "parent_model",
           "parent_config_sha256", "teachers", "teacher_config_sha256", "teacher_decoding")
# What the student takes from its teacher unless given: the vocabulary's size and the longest
# sentence (the teacher's inputs were truncated there).
INHERITED = ("vocab_size", "max_length")
RECORD = ("teachers", "teacher_config_sha256", "teacher_decoding")
DISTILL = "distill"  # the source of a value distillation set, in the effective config


def distill(teachers, requested, *, beam_size=None, alpha=None, batch_size=None,
            precision=None, continue_stopped=False, tune=True, log=None):
    """Distills `teachers` into the student run `requested.output_dir`, or continues a
    distillation stopped at any stage.

    Args:
        teachers: run directories (or ensemble directories, `runs.open_run`); several are
            decoded together as one ensemble.
        requested: the student's `TrainConfig` (not resolved), as `train` takes it; what
            `DECIDED` names must not be set.
        beam_size, alpha: the teacher's search; None: its saved choice, else the default.
        batch_size: sentences per search batch; None: the decoding request's default.
        precision: what the teacher's search computes in ("auto", "float32", "bfloat16");
            None: auto. These four are checked as the decoding request checks them.
        continue_stopped: train on a student that stopped early (`training.trainer.train`).
        tune: then choose the student's weights, alpha and repetition controls on its dev
            set, as `train` does (`tasks.stages.tune_trained`).
        log: where progress lines go (default standard error).

    Returns:
        the training summary (`training.trainer.train`) with "corpus": the distilled files.
    """
    from keras_transformer.tasks import stages

    search = dict(beam_size=beam_size, alpha=alpha, batch_size=batch_size, precision=precision)
    student = Run(requested.output_dir)
    runs, target = checked_request(teachers, requested, student)
    with student.lock("distillation", create=True):
        plan = Distillation.resolve(runs, target, requested, student, search)
        plan.make_corpus(log or sys.stderr)
        summary = stages.train(plan.config, continue_stopped=continue_stopped)
        if tune:
            stages.tune_trained(student, "model" in summary, plan.config.verbose > 0)
    return {**summary, "corpus": {name: str(path) for name, path in plan.corpus.items()}}


@dataclasses.dataclass
class Distillation:
    """A distillation request resolved: what the student trains with and, while its corpus is
    not complete, the teacher that makes it.

    Attributes:
        student: the student `Run`.
        config: the student's config (its data: the distilled corpus; the teachers' record).
        teacher: the teacher run (or ensemble) that translates; None once the corpus is
            complete.
        decoder: the teacher's `decoding.decoder.Decoder`; None with `teacher`.
        target: a teacher of several target languages: the one it translates into.
    """

    student: Run
    config: TrainConfig
    teacher: Run = None
    decoder: object = None
    target: str = None

    @classmethod
    def resolve(cls, runs, target, requested, student, search):
        """The request resolved under the student's lock (`checked_request` first): the
        teachers' opened `runs`, the `target` of a teacher of several, the student's
        `requested` settings, its `Run`, the teacher's `search` ({option: value or None}).
        ConfigError or RunError before anything is written."""
        teachers = [str(run.directory) for run in runs]
        saved = _saved_student(student, teachers)
        teacher = decoder = recorded = None
        dev = saved is not None and saved.dev_src is not None
        made = saved is not None and student.distilled_path("train", saved.tgt_lang).is_file()
        if not made:  # the corpus to make, by the teacher
            teacher = open_teachers(runs)
            decoder = teacher_decoder(teacher, search, target)
            recorded = record(teachers, decoder)
            if saved is not None:
                check_recorded(saved, recorded)
            else:  # a teacher's corpus with nothing to copy is refused before the record
                dev = check_corpus(teacher.config, target)
        config = student_config(requested, student, saved or teacher.config, dev, recorded,
                                target)
        return cls(student, config, teacher, decoder, target)

    @property
    def corpus(self):
        """{name: path} of the student's corpus files (`corpus_files`)."""
        config = self.config
        return corpus_files(self.student, config.src_lang, config.tgt_lang,
                            dev=config.dev_src is not None)

    def make_corpus(self, log):
        """Stages 1 and 2: the student's config (the record, first), the copied corpus and the
        teacher's translation; said and skipped when the corpus is complete."""
        corpus = self.corpus
        target = corpus["train_tgt"]
        if self.teacher is None:
            print(f"distill: the corpus in {target.parent} is complete; training the student",
                  file=log, flush=True)
            return
        from keras_transformer.decoding.jobs.streaming import translate_file

        self.config = self.student.save_config(self.student.config_for(self.config))
        copy_corpus(self.teacher.config, corpus, self.target)
        print(f"distill: the teacher translates its training sources into {target}",
              file=log, flush=True)
        translate_file(self.decoder, str(corpus["train_src"]), str(target), log=log)


def checked_request(teachers, requested, student):
    """The refusals that need no lock: no teacher, a student that is a teacher, settings that
    distillation decides (`DECIDED`). Returns the teachers' runs (opened, not checked: see
    `open_teachers`) and the pair a teacher of several translates into (`teachers_target`)."""
    if not teachers:
        raise ConfigError("distillation needs at least one teacher run.")
    runs = [open_run(os.path.abspath(path)) for path in teachers]
    if student.directory.resolve() in [run.directory for run in runs]:
        raise ConfigError(f"{student.directory} is a teacher: give the student another "
                          "output directory.")
    target = teachers_target(runs, requested)
    refused = sorted(key for key in DECIDED if key in requested.sources
                     and not (key == "tgt_lang" and target is not None))
    if refused:
        raise ConfigError(f"distillation decides {', '.join(refused)} for the student (it "
                          "trains on the teacher's translations, in the teacher's languages): "
                          "leave them out of the config.")
    return runs, target


def _saved_student(student, teachers):
    """The student's saved config when it was distilled from `teachers` before; None for a new
    run. A run that is not a student of these teachers is refused (ConfigError)."""
    if not student.is_run():
        return None
    saved = student.config
    if saved.teachers is None:
        raise ConfigError(f"{student.directory} is a training run that was not distilled: give "
                          "the student a new output directory.")
    if saved.teachers != teachers:
        raise ConfigError(f"{student.directory} is the student of {', '.join(saved.teachers)}, "
                          f"not of {', '.join(teachers)}: give the same teachers to continue it, "
                          "or a new output directory.")
    return saved


def corpus_files(student, src_lang, tgt_lang, dev=True):
    """{name: path} of the student's corpus: train.SRC, train.TGT (the teacher's translation:
    the corpus is complete once it exists) and, with `dev` (the teacher has a dev set),
    dev.SRC and dev.TGT."""
    files = {"train_src": student.distilled_path("train", src_lang),
             "train_tgt": student.distilled_path("train", tgt_lang)}
    if dev:
        files.update(dev_src=student.distilled_path("dev", src_lang),
                     dev_tgt=student.distilled_path("dev", tgt_lang))
    return files


def teachers_target(runs, requested):
    """The pair a student of a teacher of several target languages learns: the student's
    `--tgt-lang`, one of the teacher's (ConfigError naming them otherwise); None for one-pair
    teachers (and directories that are not runs: `open_teachers` refuses those)."""
    targets = None
    for run in runs:
        if run.is_run() and run.config.target_languages is not None:
            targets = run.config.target_languages
    if targets is None:
        return None
    if "tgt_lang" not in requested.sources or isinstance(requested.tgt_lang, list):
        raise ConfigError(f"the teacher translates into {', '.join(targets)}: name the pair "
                          f"its student learns with --tgt-lang (one of them; a student of "
                          "every pair is not supported yet).")
    if requested.tgt_lang not in targets:
        raise ConfigError(f"--tgt-lang {requested.tgt_lang!r}: the teacher translates into "
                          f"{', '.join(targets)}; choose one of them.")
    return requested.tgt_lang


def student_config(requested, student, basis, dev, record=None, target=None):
    """The student's config: `requested` with what distillation decides (the corpus files of
    the student run, with a dev set if `dev`; the languages of `basis`, its vocabulary size
    and max_length unless given, `STUDENT_PRESET` unless a preset is given) and the `record`
    of the teachers ({teachers, teacher_config_sha256, teacher_decoding}). `basis` is the
    teacher's config, or the student's own saved one when it resumes (whose record it
    keeps). Values set here say so in the effective config ([distill])."""
    resumed = basis.teachers is not None
    where = basis.data_arguments(target)  # a teacher of several targets: the pair's
    src_lang, tgt_lang = where["src_lang"], where["tgt_lang"]
    values = {"dataset": "text", "src_lang": src_lang, "tgt_lang": tgt_lang}
    files = corpus_files(student, src_lang, tgt_lang, dev=dev)
    values.update({key: str(path.resolve()) for key, path in files.items()})
    values.update({key: getattr(basis, key) for key in INHERITED
                   if key not in requested.sources and key not in values})
    if resumed:
        values.update({key: getattr(basis, key) for key in RECORD})
    else:
        values.update(record or {})
        if "preset" not in requested.sources:
            values["preset"] = STUDENT_PRESET
    config = requested.replaced(**values)
    config.sources.update(dict.fromkeys(values, DISTILL))
    return config


def check_corpus(teacher_config, target=None):
    """DataError naming the teacher's own text files (its training sources, its dev pairs)
    when they have no pair to read (empty, or every pair with an empty side): a student run
    that records such a teacher could never be made. Reads up to each split's first pair.
    Returns whether the teacher has a dev set (the student's, copied)."""
    from pipelines import datasets

    where = teacher_config.data_arguments(target)
    for split in ("train", "dev"):
        datasets.check_has_pairs(teacher_config.dataset, split, **where)
    return datasets.has_split(teacher_config.dataset, "dev", **where)


def copy_corpus(teacher_config, files, language=None):
    """Copies the teacher's training sources and its dev pairs into the student's corpus
    `files` (`corpus_files`), each once: a file already there is the corpus and is kept (the
    translation's resumable record knows it by its identity). Pairs are read as the teacher's
    training read them (`pipelines.datasets.load_pairs`: pairs with an empty side left out),
    through tf.data a chunk at a time."""
    from pipelines import datasets

    jobs = [("train", files["train_src"], None)]
    if "dev_src" in files:
        jobs.append(("dev", files["dev_src"], files["dev_tgt"]))
    for split, source, target in jobs:
        if source.is_file() and (target is None or target.is_file()):
            continue
        pairs = datasets.load_pairs(teacher_config.dataset, split,
                                    **teacher_config.data_arguments(language))
        _write_sides(pairs, [path for path in (source, target) if path is not None])


def _write_sides(pairs, paths):
    """Writes the source (and target) side of a tf.data dataset of string pairs to `paths`,
    one line per pair, each file atomically."""
    import contextlib

    from pipelines.files import atomic_path

    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(open(stack.enter_context(atomic_path(path)), "w",
                                            encoding="utf-8", newline="\n"))
                   for path in paths]
        for pair in pairs.as_numpy_iterator():
            for handle, text in zip(handles, pair):
                handle.write(text.decode("utf-8").replace("\n", " ") + "\n")
        for handle in handles:
            handle.close()  # before the atomic rename


def open_teachers(runs):
    """The teacher to decode with, of the teachers' opened `runs`: the run (or ensemble run)
    of one directory, or the ensemble of several runs' models. RunError names a directory
    that is not a trained run."""
    for run in runs:
        if not run.is_run():
            raise RunError(f"teacher {run.directory} is not a training run directory (no "
                           f"{Run.CONFIG}) nor an ensemble's (no members/ of runs).")
        if not run.has_model():
            raise RunError(f"teacher {run.directory} has no trained model ({Run.MODEL}): train "
                           "it to the end first.")
    if len(runs) == 1:
        return runs[0]
    members = [member for run in runs
               for member in (run.members if isinstance(run, EnsembleRun) else [run])]
    return AssembledEnsemble(runs[0].directory, members)


class AssembledEnsemble(EnsembleRun):
    """Teacher runs given together, decoded as one ensemble. It was never chosen for as a
    whole, so it has no saved decoding choice: the defaults decode unless overridden."""

    def decoding(self):
        return {}


def teacher_decoder(teacher, search, target=None):
    """The teacher's decoder: the `search` values given ({option: value}, None: not given),
    the rest from its saved choice, else the defaults; checked as the decoding request checks
    them. `target`: the language a teacher of several translates into."""
    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.runs.settings import GIVEN

    given = {name: value for name, value in {**search, "target_language": target}.items()
             if value is not None}
    return Decoder.resolve(teacher, given, GIVEN)


def record(teachers, decoder):
    """What the student's config records of the teachers (`RECORD`'s keys): their
    directories, the sha256 of each decoded run's config.json, and the decoding (the model
    files, beam, alpha, extra length, precision and where each came from)."""
    teacher, request = decoder.run, decoder.request
    runs = teacher.members if isinstance(teacher, EnsembleRun) else [teacher]
    model = decoder.model_file()[0]
    models = [model] if model is not None else [run.model_file() for run in runs]
    decoding = {"models": [str(path.resolve()) for path in models],
                "beam_size": request.beam_size, "alpha": float(request.alpha),
                "extra_length": request.extra_length, "precision": decoder.precision[0],
                "origins": {name: decoder.source(name) for name in ("model", "beam_size", "alpha")},
                "chosen_by": decoder.chosen_by}
    return {"teachers": list(teachers),
            "teacher_config_sha256": {str(run.directory.resolve()): config_digest(run)
                                      for run in runs},
            "teacher_decoding": decoding}


def check_recorded(saved, recorded):
    """RunError unless the teachers decode as the student recorded when its corpus was
    started (the same configs, model files, beam, alpha and precision)."""
    for key, what in (("teacher_config_sha256", "their config.json files (sha256)"),
                      ("teacher_decoding", "their decoding")):
        if getattr(saved, key) != recorded[key]:
            raise RunError(
                f"the teachers changed since {saved.output_dir} recorded them ({what}: "
                f"recorded {getattr(saved, key)}, now {recorded[key]}); its corpus is "
                "unfinished and must come from one teacher: decode as recorded (the same "
                "beam, alpha and precision), or distill into a new output directory.")
