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
    checkpoints/        ckpt-STEP.weights.h5 + ckpt-STEP.json (the last K are kept; below)
    model.keras         the final weights of `train`
    averaged.keras      the weights chosen by `average` or by the main job
    logs/               TensorBoard logs
    *.json, hyp.*.txt   summaries and hypotheses that commands write

Checkpoints are Keras' own weight files, the same on every backend (a checkpoint saved under
JAX resumes under TensorFlow and the other way round):

    ckpt-STEP.weights.h5  `model.save_weights`: every model weight and the compiled optimizer's
                          variables (iteration count, Adam moments; under mixed_float16 also the
                          LossScaleOptimizer's loss scale), stored by Keras' attribute paths
                          (`encoder/...`, `optimizer/vars/N`)
    ckpt-STEP.json        {"step", "data_position" (training batches read per input pipeline,
                          or null), "weights" (the file name), "sha256" (of the weights file),
                          "backend", "keras"}, written after the weights file

A checkpoint counts only when both files are there. It is damaged when its JSON does not read,
the weights file's SHA-256 differs from the recorded one (truncated, corrupt, empty) or HDF5
cannot open it: `restore` then names it in a warning and uses the one before, `average` names
it and skips it. Runs made before this format have TensorFlow checkpoints
(`ckpt-STEP.index`, `ckpt-STEP.data-*`, listed as `checkpoints/ckpt-STEP`): under TensorFlow
they still resume, average and convert (`convert_checkpoints`); under another backend they
raise RunError. New saves always use the Keras format. This module imports TensorFlow only
inside the functions that read those old checkpoints.

Every file is written through the project's one atomic writer, `pipelines.files.atomic_path`
(re-exported here with `write_text`, `write_bytes`, `write_json`; `save_keras` and
`save_checkpoint` are on top of it): a reader never sees a half-written file, and a killed
writer leaves only a hidden `.tmp-PID-NAME` that the next writer of that folder removes.
TensorBoard logs are written by TensorBoard.
"""

import hashlib
import json
import logging
import pathlib
import re
import typing
import warnings

import numpy as np

from keras_transformer.errors import ConfigError, RunError
from keras_transformer.runs.config import TrainConfig
from pipelines.files import (  # noqa: F401  (re-exported: the one writer)
    TEMPORARY_PREFIX, atomic_path, remove_stale_temporaries, temporary_path, write_bytes,
    write_json, write_lines, write_text)
from pipelines.vocabulary import FILENAME as VOCABULARY_FILE, Vocabulary

log = logging.getLogger(__name__)

FORMAT_VERSION = 2  # 1: config.json held the preset's name only (no "architecture")


def save_keras(model, path):
    """`model.save(path)` (a .keras file), atomically."""
    with atomic_path(path) as temporary:
        model.save(temporary)
    return pathlib.Path(path)


# -- checkpoints ------------------------------------------------------------------------------

WEIGHTS_SUFFIX = ".weights.h5"  # Keras insists on it
_CHECKPOINT_FILE = re.compile(r"ckpt-(\d+)(\.weights\.h5|\.index)")
_STEP = re.compile(r"ckpt-(\d+)(?:\.weights\.h5)?")


class Checkpoint(typing.NamedTuple):
    """A checkpoint that was read: its path, the optimizer step and the data position saved
    with it (None when it has none)."""

    path: str
    step: int
    data_position: typing.Optional[int]


class _Damaged(Exception):
    """A checkpoint that cannot be read (the message says why)."""


def is_tensorflow_checkpoint(path):
    """Whether `path` is a TensorFlow checkpoint of a run made before the Keras format."""
    return not str(path).endswith(WEIGHTS_SUFFIX)


def checkpoint_step(path):
    """The step in a checkpoint's name (`ckpt-STEP.weights.h5` or `ckpt-STEP`)."""
    match = _STEP.fullmatch(pathlib.Path(path).name)
    if not match:
        raise ValueError(f"{path} is not named like a checkpoint (ckpt-STEP{WEIGHTS_SUFFIX}).")
    return int(match.group(1))


def _sidecar(path):
    """ckpt-STEP.json beside ckpt-STEP.weights.h5."""
    return pathlib.Path(str(path)[:-len(WEIGHTS_SUFFIX)] + ".json")


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def list_checkpoints(directory):
    """Paths of the checkpoints in `directory`, oldest first: complete Keras ones
    (`ckpt-STEP.weights.h5` with its JSON) and TensorFlow ones (`ckpt-STEP`, whose .index is
    there). Where both formats have a step, the Keras one is listed."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return []
    found = {}
    for path in directory.iterdir():
        match = _CHECKPOINT_FILE.fullmatch(path.name)
        if not match:
            continue
        step = int(match.group(1))
        if match.group(2) == WEIGHTS_SUFFIX:
            if _sidecar(path).is_file():
                found[step] = str(path)
        else:
            found.setdefault(step, str(directory / f"ckpt-{step}"))
    return [found[step] for step in sorted(found)]


def _delete_step(directory, step):
    """Removes every file of the checkpoint at `step`, in both formats (the JSON first, so that
    a half-deleted checkpoint no longer counts)."""
    for name in (f"ckpt-{step}.json", f"ckpt-{step}{WEIGHTS_SUFFIX}", f"ckpt-{step}.index"):
        (directory / name).unlink(missing_ok=True)
    for path in directory.glob(f"ckpt-{step}.data-*"):
        path.unlink(missing_ok=True)


def save_checkpoint(model, directory, step, data_position=None, keep=None):
    """Saves `model` (its weights and its compiled optimizer's variables) as
    `directory/ckpt-STEP.weights.h5`, then its JSON; keeps the newest `keep` checkpoints
    (None: all). A checkpoint already at `step` is replaced.

    Returns:
        the path of the weights file.
    """
    import keras

    directory = pathlib.Path(directory)
    remove_stale_temporaries(directory)
    path = directory / f"ckpt-{step}{WEIGHTS_SUFFIX}"
    _sidecar(path).unlink(missing_ok=True)
    with atomic_path(path) as temporary:  # .tmp-PID-ckpt-STEP.weights.h5: the suffix stays
        model.save_weights(temporary)
        digest = _sha256(temporary)
    write_json(_sidecar(path), {
        "step": int(step), "data_position": None if data_position is None else int(data_position),
        "weights": path.name, "sha256": digest, "backend": keras.backend.backend(),
        "keras": keras.__version__})
    if keep:
        _prune(directory, keep)
    return str(path)


def _prune(directory, keep):
    paths = list_checkpoints(directory)
    for path in paths[:-keep]:
        _delete_step(directory, checkpoint_step(path))
    # Weights whose JSON never came (the writer was killed between the two) before the newest.
    newest = checkpoint_step(paths[-1]) if paths else None
    for path in directory.glob(f"ckpt-*{WEIGHTS_SUFFIX}"):
        if not _sidecar(path).is_file() and newest is not None and checkpoint_step(path) < newest:
            path.unlink(missing_ok=True)
    if not any(directory.glob("ckpt-*.index")):
        (directory / "checkpoint").unlink(missing_ok=True)  # TensorFlow's index of its ones


def _read_sidecar(path):
    """The JSON of Keras checkpoint `path`; _Damaged when it does not read."""
    sidecar = _sidecar(path)
    try:
        info = json.loads(sidecar.read_text(encoding="utf-8"))
        step, position, digest = info["step"], info["data_position"], info["sha256"]
        if not (isinstance(step, int) and isinstance(digest, str)
                and (position is None or isinstance(position, int))):
            raise TypeError("step, data_position or sha256 has the wrong type")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise _Damaged(f"{sidecar.name} does not read: {type(error).__name__}: "
                       f"{_first_line(error)}") from None
    return info


def _check_keras_checkpoint(path):
    """The JSON of Keras checkpoint `path` after checking the weights file against it, and
    the names of the datasets in the weights file; _Damaged when either is not sound."""
    import h5py

    info = _read_sidecar(path)
    try:
        digest = _sha256(path)
    except OSError as error:
        raise _Damaged(f"{type(error).__name__}: {_first_line(error)}") from None
    if digest != info["sha256"]:
        raise _Damaged(f"its SHA-256 differs from the one in {_sidecar(path).name}: "
                       "truncated or corrupt")
    try:
        names = []
        with h5py.File(path, "r") as handle:
            handle.visititems(
                lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None)
    except (OSError, RuntimeError, KeyError, ValueError) as error:
        raise _Damaged(f"HDF5 cannot read it: {_first_line(error)}") from None
    return info, names


def _load_keras_checkpoint(model, path, optimizer):
    """Loads Keras checkpoint `path` into `model` (and, with `optimizer`, into its compiled
    optimizer). Returns its JSON. _Damaged when it does not read; RunError when it does not
    hold this model's weights (or, with `optimizer`, its optimizer's variables)."""
    info, names = _check_keras_checkpoint(path)
    stored = sum(1 for name in names if not name.startswith("optimizer/"))
    if stored != len(model.weights):
        raise RunError(f"{path} does not hold the weights of this model ({stored} weights in "
                       f"the file, {len(model.weights)} in the model): it comes from another "
                       "architecture.")
    compiled = getattr(model, "optimizer", None)
    skip = []
    if optimizer:
        if compiled is None:
            raise ValueError("Restoring a checkpoint needs a compiled model.")
        if not compiled.built:
            compiled.build(model.trainable_variables)
        if not any(name.startswith("optimizer/") for name in names):
            raise RunError(f"{path} holds no optimizer state: it cannot resume training.")
    elif compiled is not None:
        skip = [compiled]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model.load_weights(path, objects_to_skip=skip)
        except ValueError as error:
            raise RunError(f"{path} does not hold the weights of this model: "
                           f"{_first_line(error)}") from None
    for warning in caught:
        if "Skipping variable loading for optimizer" in str(warning.message):
            raise RunError(f"{path} does not hold the state of this optimizer "
                           f"({_first_line(warning.message)}): it was saved with other "
                           "optimizer settings (precision, gradient accumulation).")
        warnings.warn_explicit(warning.message, warning.category, warning.filename,
                               warning.lineno)
    return info


# -- TensorFlow checkpoints of runs made before the Keras format ------------------------------


def _require_tensorflow(path):
    import keras

    if keras.backend.backend() != "tensorflow":
        raise RunError(
            f"{path} is a TensorFlow checkpoint (a run made before checkpoints were Keras "
            f"weight files) and the Keras backend is {keras.backend.backend()!r}: resume, "
            "average or convert the run under TensorFlow first (KERAS_BACKEND=tensorflow; "
            "`Run.convert_checkpoints`), which saves checkpoints every backend reads.")


def _tensorflow_damage():
    """What reading a damaged TensorFlow checkpoint raises: a truncated data file gives
    IndexError ("Read less bytes than requested"), a corrupt one DataLossError or another
    OpError."""
    import tensorflow as tf

    return (tf.errors.OpError, IndexError, ValueError, OSError)


def model_variables(model):
    """{path inside the model: tf.Variable} for every weight of `model` (TensorFlow
    checkpoints).

    Keras 3 keeps lists of sublayers (a stack's layers) and the optimizer's slot lists out of
    TensorFlow's object graph, so `tf.train.Checkpoint(model=model)` would silently save only
    some weights. TensorFlow checkpoints therefore named every variable explicitly, by its
    Keras path without the model's own (auto-numbered) name.
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
    (step, Adam moments), the latter by position: how runs made before the Keras format
    saved (TensorFlow backend only)."""
    import tensorflow as tf

    if optimizer is None:
        return tf.train.Checkpoint(model=model_variables(model))
    return tf.train.Checkpoint(model=model_variables(model),
                               optimizer=[v.value for v in optimizer.variables])


def _missing_weights(path, model):
    import tensorflow as tf

    # Checkpoint keys spell "/" inside a name as ".S".
    stored = {name.split("/.ATTRIBUTES")[0].replace(".S", "/")
              for name, _ in tf.train.list_variables(str(path))}
    missing = [key for key in model_variables(model) if f"model/{key}" not in stored]
    return RunError(
        f"{path} does not hold every weight of this model ({len(missing)} missing, e.g. "
        f"{missing[:2]}): it comes from another architecture or from an older "
        "keras-transformer whose checkpoints were incomplete.")


def _load_tensorflow_checkpoint(model, path, optimizer):
    """Loads TensorFlow checkpoint `path` into `model` (and its optimizer, with `optimizer`)."""
    _require_tensorflow(path)
    checkpoint = training_checkpoint(model, model.optimizer if optimizer else None)
    try:
        # expect_partial: the data position is read on its own.
        checkpoint.read(str(path)).expect_partial().assert_existing_objects_matched()
    except AssertionError:
        raise _missing_weights(path, model) from None
    except _tensorflow_damage() as error:
        raise _Damaged(f"{type(error).__name__}: {_first_line(error)}") from None


def _tensorflow_data_position(path):
    import tensorflow as tf

    key = "data_position/.ATTRIBUTES/VARIABLE_VALUE"
    try:
        if key not in dict(tf.train.list_variables(str(path))):
            return None
        return int(tf.train.load_variable(str(path), key))
    except _tensorflow_damage() as error:
        raise _Damaged(f"{type(error).__name__}: {_first_line(error)}") from None


# -- reading checkpoints, either format -------------------------------------------------------


def restore_checkpoint(model, path):
    """Restores `model`'s weights and its compiled optimizer's variables from `path`.

    Returns:
        a `Checkpoint`. Raises _Damaged when it does not read, RunError when it does not match.
    """
    if is_tensorflow_checkpoint(path):
        _load_tensorflow_checkpoint(model, path, optimizer=True)
        return Checkpoint(str(path), checkpoint_step(path), _tensorflow_data_position(path))
    info = _load_keras_checkpoint(model, path, optimizer=True)
    return Checkpoint(str(path), info["step"], info["data_position"])


def read_data_position(path):
    """The data position saved with checkpoint `path`, or None when it has none."""
    try:
        if is_tensorflow_checkpoint(path):
            _require_tensorflow(path)
            return _tensorflow_data_position(path)
        return _read_sidecar(path)["data_position"]
    except _Damaged as error:
        raise RunError(f"checkpoint {path} is damaged ({error}).") from None


def average_checkpoints(model, paths, skip_damaged=False):
    """Sets `model`'s weights to the element-wise mean of its weights in `paths` (optimizer
    state is not read).

    Args:
        skip_damaged: a checkpoint that cannot be read is named in a warning and left out
            (otherwise RunError names it).

    Returns:
        the paths averaged.
    """
    total, used = None, []
    for path in paths:
        try:
            if is_tensorflow_checkpoint(path):
                _load_tensorflow_checkpoint(model, path, optimizer=False)
            else:
                _load_keras_checkpoint(model, path, optimizer=False)
        except _Damaged as error:
            if not skip_damaged:
                raise RunError(f"checkpoint {path} is damaged ({error}).") from None
            log.warning("checkpoint %s is damaged (%s); skipped", path, error)
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

    # Models.
    def build_model(self):
        """A new, built `Transformer` of the run's architecture and vocabulary."""
        from keras_transformer.models.transformer import Transformer

        model = Transformer(vocab_size=self.vocabulary().vocab_size,
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
    def save_checkpoint(self, model, step, data_position=None, keep=None, directory=None):
        """Saves `model` and its compiled optimizer as checkpoint `step` with the data position
        (training batches read per input pipeline) into the run's checkpoints (or
        `directory`), keeping the newest `keep` (None: all). Returns the path."""
        return save_checkpoint(model, directory or self.checkpoint_dir, step, data_position,
                               keep)

    def checkpoints(self):
        """Paths of the run's checkpoints, oldest first, both formats (`list_checkpoints`)."""
        return list_checkpoints(self.checkpoint_dir)

    checkpoint_step = staticmethod(checkpoint_step)
    data_position = staticmethod(read_data_position)

    def restore(self, model):
        """Restores `model` (compiled: its optimizer too) from the newest checkpoint that
        reads. A damaged one is named in a warning and the one before it is used.

        Returns:
            the `Checkpoint` (path, step, data position) restored from, or None when the run
            has no readable checkpoint.
        """
        for path in reversed(self.checkpoints()):
            try:
                return restore_checkpoint(model, path)
            except _Damaged as error:
                log.warning("checkpoint %s is damaged (%s); using the one before it", path,
                            error)
        return None

    def convert_checkpoints(self, model):
        """Rewrites the run's TensorFlow checkpoints (runs made before the Keras format) as
        Keras checkpoints, with their optimizer state and data position, and deletes them
        (TensorFlow backend only). `model` is compiled as for training. A damaged one is
        named and left as it is.

        Returns:
            the paths written.
        """
        written = []
        for path in self.checkpoints():
            if not is_tensorflow_checkpoint(path):
                continue
            try:
                restored = restore_checkpoint(model, path)
            except _Damaged as error:
                log.warning("checkpoint %s is damaged (%s); not converted", path, error)
                continue
            written.append(self.save_checkpoint(model, restored.step, restored.data_position))
            for old in (*self.checkpoint_dir.glob(f"ckpt-{restored.step}.data-*"),
                        self.checkpoint_dir / f"ckpt-{restored.step}.index"):
                old.unlink(missing_ok=True)
        if not any(self.checkpoint_dir.glob("ckpt-*.index")):
            (self.checkpoint_dir / "checkpoint").unlink(missing_ok=True)
        return written

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
