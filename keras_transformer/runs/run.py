"""A training run directory, with one owner: `Run`. No other module builds a path inside it.

    run = Run("runs/multi30k-en-de")
    run.config                  # the saved TrainConfig (resolved: the architecture included)
    run.tokenizer()             # the run's subword vocabulary
    run.load_model()            # averaged.keras if present, else model.keras
    model, paths = run.average(last_k=5)
    run.save_model(model, averaged=True)
    run.save_decoding(model="averaged.keras", weights="average of the last 5 checkpoints",
                      beam_size=4, alpha=1.0, chosen_by="the main job, on val")
    run.decoding()              # those choices; run.decoding_model_path(): the file to decode

Layout of a run directory (format version 2):

    config.json         format version, the resolved architecture and training settings
    vocab/spm.model     the shared subword vocabulary (from the prepared data); vocab/spm.json
                        says which
    checkpoints/        ckpt-STEP.weights.h5 + ckpt-STEP.json, the last K kept (written and
                        read by runs/checkpoints.py, which describes them)
    model.keras         the final weights of `train`
    averaged.keras      the weights chosen by `average` or by the main job
    best.keras          the weights of the best dev evaluation so far (`train --keep-best`, on
                        by default with a dev set); best.json beside it: {"step", "metric",
                        "value"}, written after it
    decoding.json       the decoding choices made for the run (`save_decoding`): {"format_version",
                        "model" (a .keras file of the run, or null), "weights" (which weights
                        those are, e.g. "average of the last 5 checkpoints"), "beam_size",
                        "alpha", "no_repeat_ngram_size", "repetition_penalty", "chosen_by"
                        (which command chose them, on which data)}; any key may be absent
                        (the repetition controls then off). An ensemble keeps its own in its top directory.
    distilled/          a student's corpus (`distill`): SPLIT.LANG files, the teacher's
                        training sources and their translations, its dev set and references
    logs/               TensorBoard events: logs/train and logs/dev (training/tensorboard.py)
    *.json, hyp.*.txt   summaries and hypotheses that commands write
    .lock               the writers' lock (`Run.lock`): who trains, averages into or exports
                        from the run now, or did last

Every file is written through the project's one atomic writer, `pipelines.files.atomic_path`
(re-exported here with `write_text`, `write_bytes`, `write_lines`, `write_json`;
`model_files.save_keras` is on top of it): a reader never sees a half-written file, and a
killed writer leaves only a hidden `.tmp-PID-NAME` that the next writer of that folder
removes. TensorBoard events are written by the tensorboard package's writer.
"""

import contextlib
import json
import logging
import pathlib

from keras_transformer.errors import ConfigError, RunError
from keras_transformer.runs.checkpoints import (  # noqa: F401  (Checkpoint: restore's result)
    Checkpoint, average_checkpoints, checkpoint_step, choose_last, list_checkpoints,
    newest_readable, read_data_position, restore_newest, save_checkpoint)
from keras_transformer.runs.choices import read_choices, save_choices
from keras_transformer.runs.config import TrainConfig
from keras_transformer.runs.model_files import ModelFiles
from pipelines.lock import FolderBusy, FolderLock
from pipelines.files import (  # noqa: F401  (re-exported: the one writer)
    TEMPORARY_PREFIX, atomic_path, remove_stale_temporaries, temporary_path, write_bytes,
    write_json, write_lines, write_text)
from pipelines.vocabulary import FILENAME as VOCABULARY_FILE, Vocabulary

log = logging.getLogger(__name__)

FORMAT_VERSION = TrainConfig.FORMAT_VERSION  # of config.json


class Run(ModelFiles):
    """A training run directory: its layout, saved config, vocabulary, models (the methods of
    `ModelFiles`, runs/model_files.py), decoding choices, and (through runs/checkpoints.py) its
    checkpoints.

    Args:
        directory: the run directory (it need not exist yet for a new run).
    """

    config_class = TrainConfig  # what config.json holds
    CONFIG = "config.json"
    MODEL = "model.keras"
    AVERAGED = "averaged.keras"
    BEST = "best.keras"
    BEST_RECORD = "best.json"
    DECODING = "decoding.json"
    CHECKPOINTS = "checkpoints"
    VOCABULARY = "vocab"
    DISTILLED = "distilled"

    def __init__(self, directory):
        self.directory = pathlib.Path(directory)
        self._config = None
        self._tokenizer = None
        self._vocabulary = None

    def __repr__(self):
        return f"Run({str(self.directory)!r})"

    # Paths. Only this class spells a name inside a run directory.
    @property
    def config_path(self):
        return self.directory / self.CONFIG

    @property
    def model_path(self):
        return self.directory / self.MODEL

    @property
    def averaged_path(self):
        return self.directory / self.AVERAGED

    @property
    def best_path(self):
        return self.directory / self.BEST

    @property
    def best_record_path(self):
        return self.directory / self.BEST_RECORD

    @property
    def decoding_path(self):
        return self.directory / self.DECODING

    @property
    def checkpoint_dir(self):
        return self.directory / self.CHECKPOINTS

    @property
    def tokenizer_path(self):
        return self.directory / self.VOCABULARY / VOCABULARY_FILE

    def worker_checkpoint_dir(self, task_id):
        """Where a non-chief MultiWorkerMirroredStrategy worker saves its newest checkpoint:
        only the chief's checkpoints are the run's; a worker's own shows that the workers
        stay identical."""
        return self.directory / f"scratch-worker-{task_id}"

    def distilled_path(self, split, lang):
        """A file of the distilled corpus a student run trains on: distilled/SPLIT.LANG
        (tasks/distill.py writes it)."""
        if "/" in split or "/" in lang or not split or not lang:
            raise ValueError(f"{split!r}.{lang!r} is not a corpus file name (split.lang).")
        return self.directory / self.DISTILLED / f"{split}.{lang}"

    def logs_dir(self, name):
        return self.directory / "logs" / name

    def file(self, name):
        """A file that a command writes into the run (summaries, hypotheses)."""
        if "/" in name or name in (self.CONFIG, self.MODEL, self.AVERAGED, self.DECODING,
                                   self.BEST, self.BEST_RECORD):
            raise ValueError(f"{name!r} is not a free file name inside a run directory.")
        return self.directory / name

    def hypotheses_path(self, split, beam_size, language=None):
        """hyp.SPLIT.beamK.txt; of one target of a run of several: hyp.SPLIT.beamK.LANG.txt."""
        return self.file(f"hyp.{split}.beam{beam_size}"
                         + (f".{language}" if language else "") + ".txt")

    def is_run(self):
        return self.config_path.is_file()

    @contextlib.contextmanager
    def lock(self, purpose, create=False):
        """Holds the run's writer lock while the block runs: one process at a time trains,
        averages into or exports from a run; readers (translate, evaluate) take none. The
        operating system drops it when the process ends, however it ends. RunError names the
        holder (pid, host, since when) when another process has it, or the directory when it
        is missing (`create`: make it, for a new run)."""
        if not create and not self.directory.is_dir():
            raise RunError(f"{self.directory} not found: is it a training run directory?")
        try:
            lock = FolderLock(self.directory, purpose).acquire()
        except FolderBusy as busy:
            raise RunError(f"cannot start {purpose}: {busy}; a run has one writer at a time: "
                           "wait for that process to end or stop it") from None
        try:
            yield lock
        finally:
            lock.release()

    # The config.
    @property
    def config(self):
        """The saved config, resolved. Runs of format 1 (the preset's name only) get their
        architecture from today's preset table, which is all they recorded."""
        if self._config is None:
            self._config = self.read_config()
        return self._config

    def read_config(self):
        """The saved config.json (this format or an older one: `TrainConfig.from_document`),
        with the run's current directory as its output_dir, resolved."""
        if not self.config_path.is_file():
            raise RunError(f"{self.directory} is not a training run directory (no "
                           f"{self.CONFIG}).")
        try:
            values = json.loads(self.config_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise RunError(f"{self.config_path} is damaged (not JSON: {error}).") from None
        if not isinstance(values, dict):
            raise RunError(f"{self.config_path} is damaged (not a mapping of settings).")
        try:
            config = self.config_class.from_document(values, str(self.config_path))
        except ConfigError as error:
            raise RunError(f"{self.config_path}: {error}") from None
        if "architecture" not in values and "model" not in values:
            log.info("%s is a format-1 run: its architecture comes from today's preset %r",
                     self.directory, config.preset)
        # The directory may have moved since: it is where the run is now.
        config = config.replaced(output_dir=str(self.directory))
        config.sources.clear()
        return config.resolved()

    def save_config(self, config):
        """Writes the resolved config: one mapping per section and the format version."""
        config = config.resolved()
        write_json(self.config_path, config.to_dict())
        self._config = config
        return config

    def config_for(self, requested):
        """The config to train with: `requested` (resolved) for a new run; for an existing
        one its saved config, continued with what `requested` may change
        (`TrainConfig.continued`)."""
        config = (self.config.continued(requested) if self.is_run()
                  else requested.resolved())
        self._config = config  # what this process trains with (before the chief saves it)
        return config

    # The vocabulary.
    def _vocabulary_bytes_or_fail(self):
        if not self.tokenizer_path.is_file():
            raise RunError(f"{self.tokenizer_path} not found: is {self.directory} a "
                           "training run whose vocabulary was built?")
        return self.tokenizer_path.read_bytes()

    def tokenizer(self):
        """The run's vocabulary as a TensorFlow `SubwordTokenizer` (tf.data, exports)."""
        if self._tokenizer is None:
            from pipelines.tokenizer import SubwordTokenizer

            self._tokenizer = SubwordTokenizer(self._vocabulary_bytes_or_fail())
        return self._tokenizer

    def vocabulary(self):
        """The run's vocabulary as a plain-Python `Vocabulary` (no TensorFlow)."""
        if self._vocabulary is None:
            self._vocabulary = Vocabulary(self._vocabulary_bytes_or_fail())
        return self._vocabulary

    def use_vocabulary(self, model_path, info=None):
        """Takes the vocabulary of prepared data (`model_path`, a sentencepiece model) as the
        run's own, unless the run has that very vocabulary already. A run keeps its
        vocabulary: a different one is refused.

        Returns:
            the run's `Vocabulary`.
        """
        data = pathlib.Path(model_path).read_bytes()
        if self.tokenizer_path.is_file():
            if self.tokenizer_path.read_bytes() != data:
                raise RunError(f"{self.tokenizer_path} differs from the vocabulary of the "
                               f"prepared data ({model_path}): prepare the data with the run's "
                               "vocabulary, or train into a new output directory.")
            return self.vocabulary()
        write_bytes(self.tokenizer_path, data)
        write_json(self.tokenizer_path.with_name("spm.json"),
                   {"from": str(model_path), **(info or {})})
        self._tokenizer = self._vocabulary = None
        return self.vocabulary()

    def vocabulary_bytes(self):
        """The run's sentencepiece model (bytes), or None before it has one."""
        return self.tokenizer_path.read_bytes() if self.tokenizer_path.is_file() else None

    # The decoding choices.
    def decoding(self):
        """The decoding choices saved for the run (decoding.json, runs/choices.py): a dict of
        some of "model", "weights", "beam_size", "alpha", "no_repeat_ngram_size",
        "repetition_penalty", "chosen_by"; {} when none were
        saved. RunError names the file when it is damaged or newer than this version."""
        return read_choices(self.decoding_path)

    def save_decoding(self, **choices):
        """Merges `choices` into the saved decoding choices and writes decoding.json
        atomically with its format version.

        Args:
            model: the file name of the model to decode with, inside the run (e.g.
                "averaged.keras"), or None.
            weights: which weights that file holds (e.g. "average of the last 5 checkpoints").
            beam_size, alpha, no_repeat_ngram_size, repetition_penalty: the search's
                (checked by their declaration, decoding/request.py: call this through
                `decoding.decoder.Decoder.save_choice`, their one writer).
            chosen_by: which command chose them, on which data (e.g. "main job, on val").

        Returns:
            the merged choices. ValueError names an unknown key or a bad value.
        """
        return save_choices(self.decoding_path, **choices)

    def decoding_model_path(self):
        """The model file to decode with: the one decoding.json names when it is there, else
        `model_file()` (averaged.keras if present, else model.keras)."""
        name = self.decoding().get("model")
        if name:
            path = self.directory / name
            if path.is_file():
                return path
            log.warning("%s names %s, which is not in %s: using %s", self.decoding_path, name,
                        self.directory, self.model_file().name)
        return self.model_file()

    # Checkpoints (runs/checkpoints.py reads and writes them).
    def save_checkpoint(self, model, step, data_position=None, keep=None, directory=None,
                        state=None):
        """Saves `model` and its compiled optimizer as checkpoint `step` with the data position
        (training batches read per input pipeline) and the training `state` (a JSON-able dict)
        into the run's checkpoints (or `directory`), keeping the newest `keep` (None: all).
        Returns the path."""
        return save_checkpoint(model, directory or self.checkpoint_dir, step, data_position,
                               keep, state)

    def checkpoints(self):
        """Paths of the run's checkpoints, oldest first. RunError when the run holds
        TensorFlow-format checkpoints of keras-transformer 0.2.0 or earlier."""
        return list_checkpoints(self.checkpoint_dir)

    def has_checkpoint(self):
        """Whether the run has a checkpoint that reads (one `restore` would resume from)."""
        return newest_readable(self.checkpoint_dir) is not None

    checkpoint_step = staticmethod(checkpoint_step)
    data_position = staticmethod(read_data_position)

    def restore(self, model):
        """Restores `model` (compiled: its optimizer too) from the newest checkpoint that
        reads. A damaged one is named in a warning and the one before it is used.

        Returns:
            the `Checkpoint` (path, step, data position) restored from, or None when the run
            has no readable checkpoint.
        """
        return restore_newest(model, self.checkpoint_dir)

    def average(self, last_k, model=None, every=1):
        """The mean of the weights of the last `last_k` checkpoints, taking every `every`-th
        one counting back from the newest (every=2: the newest, the third newest, ...). A
        damaged one is named in a warning and skipped (the average then has one fewer).

        Returns:
            (model, paths averaged, oldest first). `model` defaults to a new `build_model()`.
        """
        if last_k < 1 or every < 1:
            raise ValueError(f"last_k={last_k} and every={every} must be at least 1.")
        paths = self.checkpoints()
        if not paths:
            raise RunError(f"No checkpoints found in {self.checkpoint_dir}.")
        chosen = choose_last(paths, last_k, every)
        if len(chosen) < last_k:
            log.warning("Asked to average %d checkpoints%s; %s has only %d.", last_k,
                        f" {every} apart" if every > 1 else "", self.checkpoint_dir,
                        len(chosen))
        model = model or self.build_model()
        used = average_checkpoints(model, chosen, skip_damaged=True)
        return model, used

    # Summaries.
    def write_json(self, name, data):
        return write_json(self.file(name), data)

    def read_json(self, name, default=None):
        path = self.file(name)
        if not path.is_file():
            return default
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise RunError(f"{path} is damaged (not JSON: {error}).") from None
