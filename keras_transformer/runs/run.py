"""A training run directory, with one owner: `Run`. No other module builds a path inside it.

    run = Run("runs/multi30k-en-de")
    run.config                  # the saved TrainConfig (resolved: the architecture included)
    run.tokenizer()             # the run's subword vocabulary
    run.load_model()            # averaged.keras if present, else model.keras
    model, paths = run.average(last_k=5)
    run.save_model(model, averaged=True)

Layout of a run directory (format version 2):

    config.json         format version, the resolved architecture and training settings
    vocab/spm.model     the shared subword vocabulary (from the prepared data); vocab/spm.json
                        says which
    checkpoints/        TensorFlow checkpoints ckpt-STEP.* (the last K are kept)
    model.keras         the final weights of `train`
    averaged.keras      the weights chosen by `average` or by the main job
    logs/               TensorBoard logs
    *.json, hyp.*.txt   summaries and hypotheses that commands write

Every file is written through the project's one atomic writer, `pipelines.files.atomic_path`
(re-exported here with `write_text`, `write_bytes`, `write_json`; `save_keras` is on top of it):
a reader never sees a half-written file, and a killed writer leaves only a hidden
`.tmp-PID-NAME` that the next writer of that folder removes. TensorFlow's own checkpoint files
and TensorBoard logs are written by TensorFlow.
"""

import json
import logging
import pathlib
import time

import numpy as np
import tensorflow as tf

from keras_transformer.errors import ConfigError, RunError
from keras_transformer.runs.config import TrainConfig
from pipelines.files import (  # noqa: F401  (re-exported: the one writer)
    TEMPORARY_PREFIX, atomic_path, remove_stale_temporaries, temporary_path, write_bytes,
    write_json, write_lines, write_text)
from pipelines.tokenizer import SubwordTokenizer

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 1: config.json held the preset's name only (no "architecture")


def save_keras(model, path):
    """`model.save(path)` (a .keras file), atomically."""
    with atomic_path(path) as temporary:
        model.save(temporary)
    return pathlib.Path(path)


# -- checkpoints ------------------------------------------------------------------------------


def model_variables(model):
    """{path inside the model: tf.Variable} for every weight of `model`.

    Keras 3 keeps lists of sublayers (a stack's layers) and the optimizer's slot lists out of
    TensorFlow's object graph, so `tf.train.Checkpoint(model=model)` would silently save only
    some weights. Checkpoints therefore name every variable explicitly, by its Keras path
    without the model's own (auto-numbered) name.
    """
    variables = {}
    for weight in model.weights:
        key = weight.path.split("/", 1)[1] if "/" in weight.path else weight.path
        if key in variables:
            raise ValueError(f"Two model weights share the path {key!r}.")
        variables[key] = weight.value
    return variables


def training_checkpoint(model, optimizer=None):
    """A `tf.train.Checkpoint` of all model weights and, if given, all optimizer variables
    (step, Adam moments), the latter by position (their order is fixed by the model)."""
    if optimizer is None:
        return tf.train.Checkpoint(model=model_variables(model))
    return tf.train.Checkpoint(model=model_variables(model),
                               optimizer=[v.value for v in optimizer.variables])


# What reading a damaged checkpoint raises: a truncated data file gives IndexError ("Read less
# bytes than requested"), a corrupt one DataLossError or another OpError.
_DAMAGE = (tf.errors.OpError, IndexError, ValueError, OSError)


def _read_model(checkpoint, path, model):
    """Restores only the model's weights from `path`; RunError when it lacks some."""
    try:
        checkpoint.read(str(path)).expect_partial().assert_existing_objects_matched()
    except AssertionError:
        # Checkpoint keys spell "/" inside a name as ".S".
        stored = {name.split("/.ATTRIBUTES")[0].replace(".S", "/")
                  for name, _ in tf.train.list_variables(str(path))}
        missing = [key for key in model_variables(model) if f"model/{key}" not in stored]
        raise RunError(
            f"{path} does not hold every weight of this model ({len(missing)} missing, e.g. "
            f"{missing[:2]}): it comes from another architecture or from an older "
            "keras-transformer whose checkpoints were incomplete.") from None


def average_checkpoints(model, paths, skip_damaged=False):
    """Sets `model`'s weights to the element-wise mean of its weights in `paths` (optimizer
    state is ignored).

    Args:
        skip_damaged: a checkpoint that cannot be read is named in a warning and left out
            (otherwise the error is raised).

    Returns:
        the paths averaged.
    """
    checkpoint = training_checkpoint(model)
    total, used = None, []
    for path in paths:
        try:
            _read_model(checkpoint, path, model)
        except _DAMAGE as error:
            if not skip_damaged:
                raise RunError(f"checkpoint {path} is damaged ({type(error).__name__}: "
                               f"{_first_line(error)}).") from None
            log.warning("checkpoint %s is damaged (%s: %s); skipped", path,
                        type(error).__name__, _first_line(error))
            continue
        weights = [w.astype(np.float64) for w in model.get_weights()]
        total = weights if total is None else [t + w for t, w in zip(total, weights)]
        used.append(path)
    if not used:
        raise RunError("No readable checkpoints to average.")
    mean = [(t / len(used)) for t in total]
    model.set_weights([m.astype(w.dtype) for m, w in zip(mean, model.get_weights())])
    return used


def _first_line(error):
    return (str(error).splitlines() or [""])[0][:200]


# -- the run ----------------------------------------------------------------------------------


class Run:
    """A training run directory: its layout, saved config, vocabulary, models and checkpoints.

    Args:
        directory: the run directory (it need not exist yet for a new run).
    """

    CONFIG = "config.json"
    MODEL = "model.keras"
    AVERAGED = "averaged.keras"
    CHECKPOINTS = "checkpoints"
    VOCABULARY = "vocab"

    def __init__(self, directory):
        self.directory = pathlib.Path(directory)
        self._config = None
        self._tokenizer = None

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
    def checkpoint_dir(self):
        return self.directory / self.CHECKPOINTS

    @property
    def tokenizer_path(self):
        return self.directory / self.VOCABULARY / SubwordTokenizer.FILENAME

    def worker_checkpoint_dir(self, task_id):
        """Where a non-chief MultiWorkerMirroredStrategy worker saves (collectives need every
        worker to save; only the chief's checkpoints are the run's)."""
        return self.directory / f"scratch-worker-{task_id}"

    def logs_dir(self, name):
        return self.directory / "logs" / name

    def file(self, name):
        """A file that a command writes into the run (summaries, hypotheses)."""
        if "/" in name or name in (self.CONFIG, self.MODEL, self.AVERAGED):
            raise ValueError(f"{name!r} is not a free file name inside a run directory.")
        return self.directory / name

    def hypotheses_path(self, split, beam_size):
        return self.file(f"hyp.{split}.beam{beam_size}.txt")

    def is_run(self):
        return self.config_path.is_file()

    # The config.
    @property
    def config(self):
        """The saved config, resolved. Runs of format 1 (the preset's name only) get their
        architecture from today's preset table, which is all they recorded."""
        if self._config is None:
            self._config = self.read_config()
        return self._config

    def read_config(self):
        if not self.config_path.is_file():
            raise RunError(f"{self.directory} is not a training run directory (no "
                           f"{self.CONFIG}).")
        try:
            values = json.loads(self.config_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise RunError(f"{self.config_path} is damaged (not JSON: {error}).") from None
        version = values.pop("format_version", 1)
        if not isinstance(version, int) or version > FORMAT_VERSION:
            raise RunError(f"{self.config_path} has format version {version!r}, newer than "
                           f"this keras-transformer reads ({FORMAT_VERSION}): upgrade it.")
        try:
            config = TrainConfig(**values)
        except (TypeError, ConfigError) as error:
            raise RunError(f"{self.config_path}: {error}") from None
        if version == 1 and config.architecture is None:
            log.info("%s is a format-1 run: its architecture comes from today's preset %r",
                     self.directory, config.preset)
        # The directory may have moved since: it is where the run is now.
        config.output_dir = str(self.directory)
        return config.resolved()

    def save_config(self, config):
        """Writes the resolved config with the format version."""
        config = config.resolved()
        write_json(self.config_path, {"format_version": FORMAT_VERSION, **config.to_dict()})
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
    def tokenizer(self):
        if self._tokenizer is None:
            if not self.tokenizer_path.is_file():
                raise RunError(f"{self.tokenizer_path} not found: is {self.directory} a "
                               "training run whose vocabulary was built?")
            self._tokenizer = SubwordTokenizer.load(self.tokenizer_path)
        return self._tokenizer

    def use_vocabulary(self, model_path, info=None):
        """Takes the vocabulary of prepared data (`model_path`, a sentencepiece model) as the
        run's own, unless the run has that very vocabulary already. A run keeps its
        vocabulary: a different one is refused.

        Returns:
            the run's tokenizer.
        """
        data = pathlib.Path(model_path).read_bytes()
        if self.tokenizer_path.is_file():
            if self.tokenizer_path.read_bytes() != data:
                raise RunError(f"{self.tokenizer_path} differs from the vocabulary of the "
                               f"prepared data ({model_path}): prepare the data with the run's "
                               "vocabulary, or train into a new output directory.")
            return self.tokenizer()
        write_bytes(self.tokenizer_path, data)
        write_json(self.tokenizer_path.with_name("spm.json"),
                   {"from": str(model_path), **(info or {})})
        self._tokenizer = None
        return self.tokenizer()

    def vocabulary_bytes(self):
        """The run's sentencepiece model (bytes), or None before it has one."""
        return self.tokenizer_path.read_bytes() if self.tokenizer_path.is_file() else None

    # Models.
    def build_model(self):
        """A new, built `Transformer` of the run's architecture and vocabulary."""
        from keras_transformer.models.transformer import Transformer

        model = Transformer(vocab_size=self.tokenizer().vocab_size,
                            **self.config.architecture)
        model.build()
        return model

    def model_file(self, prefer_averaged=True):
        if prefer_averaged and self.averaged_path.is_file():
            return self.averaged_path
        return self.model_path

    def load_model(self, prefer_averaged=True, path=None):
        """The trained model: `path` if given, else averaged.keras (when `prefer_averaged`
        and present), else model.keras."""
        import keras

        path = pathlib.Path(path) if path else self.model_file(prefer_averaged)
        if not path.is_file():
            raise RunError(f"{path} not found: is {self.directory} a finished training run?")
        try:
            return keras.models.load_model(path, compile=False)
        except (OSError, ValueError) as error:
            if path.stat().st_size == 0 or "zip" in str(error).lower():
                raise RunError(f"{path} is damaged ({error}); train again or average the "
                               "checkpoints into a new model file.") from None
            raise

    def save_model(self, model, averaged=False, path=None):
        """Saves to `path`, else averaged.keras or model.keras; returns the path."""
        path = pathlib.Path(path) if path else (self.averaged_path if averaged
                                                else self.model_path)
        return save_keras(model, path)

    def has_model(self):
        return self.model_path.is_file()

    # Checkpoints.
    def checkpoint_manager(self, model, optimizer, keep, directory=None, data_position=None):
        """(tf.train.Checkpoint, tf.train.CheckpointManager) of the model and optimizer,
        saving into the run's checkpoints (or `directory`), keeping the last `keep`.

        `data_position` (an int64 tf.Variable: training batches read per input pipeline) is
        saved with each checkpoint too; `data_position(path)` reads it back. The returned
        checkpoint (for `restore`) leaves it out, so checkpoints made without it restore.
        """
        checkpoint = training_checkpoint(model, optimizer)
        saved = checkpoint
        if data_position is not None:
            saved = tf.train.Checkpoint(model=checkpoint.model, optimizer=checkpoint.optimizer,
                                        data_position=data_position)
        manager = tf.train.CheckpointManager(
            saved, str(directory or self.checkpoint_dir), max_to_keep=keep)
        return checkpoint, manager

    @staticmethod
    def data_position(path):
        """The data position saved with checkpoint `path`, or None when it has none."""
        key = "data_position/.ATTRIBUTES/VARIABLE_VALUE"
        if key not in dict(tf.train.list_variables(str(path))):
            return None
        return int(tf.train.load_variable(str(path), key))

    def checkpoints(self):
        """Paths of the run's checkpoints, oldest first (those the index lists and whose
        files are there)."""
        state = tf.train.get_checkpoint_state(str(self.checkpoint_dir))
        if state is None:
            return []
        paths = []
        for path in state.all_model_checkpoint_paths:
            path = str(self.checkpoint_dir / pathlib.Path(path).name)  # the run may have moved
            if tf.io.gfile.exists(path + ".index"):
                paths.append(path)
        return paths

    def restore(self, checkpoint):
        """Restores `checkpoint` (from `checkpoint_manager`) from the newest checkpoint that
        reads. A damaged one is named in a warning and the one before it is used.

        Returns:
            the path restored from, or None when the run has no checkpoint.
        """
        for path in reversed(self.checkpoints()):
            try:
                # expect_partial: the data position is read on its own (`data_position`).
                checkpoint.restore(path).assert_existing_objects_matched().expect_partial()
                return path
            except _DAMAGE as error:
                log.warning("checkpoint %s is damaged (%s: %s); using the one before it",
                            path, type(error).__name__, _first_line(error))
        return None

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
        chosen = paths[::-1][::every][:last_k][::-1]
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
