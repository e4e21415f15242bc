"""Training checkpoints: Keras weight files with a JSON beside each, saved, listed, pruned,
restored and averaged. `Run` (runs/run.py) keeps them in RUN_DIR/checkpoints/ and calls these
functions; they take a folder or paths and know nothing else of a run.

A checkpoint is two files, the same on every backend (a checkpoint saved under JAX resumes
under TensorFlow and the other way round):

    ckpt-STEP.weights.h5  `model.save_weights`: every model weight and the compiled optimizer's
                          variables (iteration count, Adam moments; under mixed_float16 also the
                          LossScaleOptimizer's loss scale), stored by Keras' attribute paths
                          (`encoder/...`, `optimizer/vars/N`)
    ckpt-STEP.json        {"step", "data_position" (training batches read per input pipeline,
                          or null), "weights" (the file name), "sha256" (of the weights file),
                          "backend", "keras", "random_state" (the dropout layers' random
                          generator states, which Keras keeps out of weight files: a resumed
                          run draws the dropout masks an uninterrupted one would), "state"
                          (where training keeps counters of its own: the early-stopping
                          record)}, written after the weights file

A checkpoint counts only when both files are there. It is damaged when its JSON does not read,
the weights file's SHA-256 differs from the recorded one (truncated, corrupt, empty) or HDF5
cannot open it: `restore_newest` then names it in a warning and uses the one before,
`average_checkpoints` names it and skips it (or raises `RunError`).

keras-transformer 0.2.0 and earlier saved TensorFlow checkpoints (`ckpt-STEP.index`,
`ckpt-STEP.data-*`). They are not read: a folder that holds one is refused with a `RunError`
that says how to convert it (`refuse_tensorflow_checkpoints`).

Files are written through the project's one atomic writer (`pipelines.files`): a save that
fails (a full disk: `NoSpaceError`, which names the file) leaves the previous checkpoints as they
were and nothing of the new one. This module
imports no TensorFlow; Keras and h5py only inside the functions that need them.
"""

import hashlib
import json
import logging
import os
import pathlib
import re
import typing
import warnings


from keras_transformer.errors import RunError
from pipelines.files import atomic_path, remove_stale_temporaries, write_json

log = logging.getLogger(__name__)

WEIGHTS_SUFFIX = ".weights.h5"  # Keras insists on it
_WEIGHTS_FILE = re.compile(r"ckpt-(\d+)\.weights\.h5")
_TENSORFLOW_INDEX = re.compile(r"ckpt-(\d+)\.index")


class _CheckpointFields(typing.NamedTuple):
    path: str
    step: int
    data_position: typing.Optional[int]


class Checkpoint(_CheckpointFields):
    """A checkpoint that was read: (its path, the optimizer step, the data position saved
    with it: None when it has none), and as `state` the training state saved with it ({} when
    none: e.g. the early-stopping counters, `training/early_stopping.py`)."""

    def __new__(cls, path, step, data_position, state=None):
        checkpoint = super().__new__(cls, path, step, data_position)
        checkpoint.state = dict(state or {})
        return checkpoint


class DamagedCheckpoint(Exception):
    """A checkpoint that cannot be read (the message says why)."""


def checkpoint_step(path):
    """The step in a checkpoint's name (`ckpt-STEP.weights.h5`)."""
    match = _WEIGHTS_FILE.fullmatch(pathlib.Path(path).name)
    if not match:
        raise ValueError(f"{path} is not named like a checkpoint (ckpt-STEP{WEIGHTS_SUFFIX}).")
    return int(match.group(1))


def sidecar_path(path):
    """ckpt-STEP.json beside ckpt-STEP.weights.h5."""
    return pathlib.Path(str(path)[:-len(WEIGHTS_SUFFIX)] + ".json")


def sha256(path):
    """The SHA-256 of a file, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def refuse_tensorflow_checkpoints(directory):
    """RunError when `directory` holds a TensorFlow-format checkpoint (ckpt-STEP.index), which
    keras-transformer 0.2.0 and earlier wrote and this one does not read."""
    directory = pathlib.Path(directory)
    old = sorted((path for path in directory.glob("ckpt-*.index")
                  if _TENSORFLOW_INDEX.fullmatch(path.name)),
                 key=lambda path: int(_TENSORFLOW_INDEX.fullmatch(path.name).group(1)))
    if old:
        raise RunError(
            f"{directory} holds TensorFlow-format checkpoints ({old[-1].name}) written by "
            "keras-transformer 0.2.0 or earlier, which this version does not read: convert "
            "them with the last keras-transformer that reads them (commit a53229c: under "
            "KERAS_BACKEND=tensorflow, `Run(RUN_DIR).convert_checkpoints(model)` with the model "
            "compiled as for training, or `keras-transformer average` for averaged weights), "
            "or train again.")


def list_checkpoints(directory):
    """Paths of the complete checkpoints in `directory` (`ckpt-STEP.weights.h5` with its JSON),
    oldest first; [] when the folder is missing. RunError when it holds TensorFlow-format
    checkpoints (`refuse_tensorflow_checkpoints`)."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return []
    refuse_tensorflow_checkpoints(directory)
    found = {}
    for path in directory.iterdir():
        match = _WEIGHTS_FILE.fullmatch(path.name)
        if match and sidecar_path(path).is_file():
            found[int(match.group(1))] = str(path)
    return [found[step] for step in sorted(found)]


def _delete_step(directory, step):
    """Removes both files of the checkpoint at `step` (the JSON first, so that a half-deleted
    checkpoint no longer counts)."""
    for name in (f"ckpt-{step}.json", f"ckpt-{step}{WEIGHTS_SUFFIX}"):
        (directory / name).unlink(missing_ok=True)


def save_checkpoint(model, directory, step, data_position=None, keep=None, state=None):
    """Saves `model` (its weights and its compiled optimizer's variables) as
    `directory/ckpt-STEP.weights.h5`, then its JSON (with `state`, a JSON-able dict of the
    training's own counters, when given); keeps the newest `keep` checkpoints (None: all). A
    checkpoint already at `step` is replaced.

    Returns:
        the path of the weights file.
    """
    import keras

    directory = pathlib.Path(directory)
    remove_stale_temporaries(directory)
    path = directory / f"ckpt-{step}{WEIGHTS_SUFFIX}"
    sidecar_path(path).unlink(missing_ok=True)
    with atomic_path(path) as temporary:  # .tmp-PID-ckpt-STEP.weights.h5: the suffix stays
        _reserve(temporary, _size_bound(model))
        model.save_weights(temporary)
        digest = sha256(temporary)
    try:
        write_json(sidecar_path(path), {
            "step": int(step),
            "data_position": None if data_position is None else int(data_position),
            "weights": path.name, "sha256": digest, "backend": keras.backend.backend(),
            "keras": keras.__version__,
            "random_state": [keras.ops.convert_to_numpy(v).tolist()
                             for v in _random_states(model)],
            **({"state": state} if state else {})})
    except BaseException:
        path.unlink(missing_ok=True)  # a weights file without its JSON is no checkpoint
        raise
    if keep:
        prune_checkpoints(directory, keep)
    return str(path)


def _size_bound(model):
    """More bytes than the weights file of `model` and its optimizer takes: the arrays, plus
    HDF5's headers (well under 4 KiB a dataset), plus a margin."""
    import numpy as np

    variables = list(model.weights)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None and optimizer.built:
        variables += list(optimizer.variables)
    data = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)
    return int(data * 1.02) + 4096 * len(variables) + (1 << 20)


def _reserve(path, size):
    """Makes sure `size` bytes can be written at `path` before HDF5 writes there: a full disk
    (or a quota, or the file-size limit) then fails here with an OSError that names no space,
    rather than inside HDF5, which crashes the process (a segmentation fault in h5py 3 when a
    write fails as the file closes). HDF5 then truncates the file and writes it."""
    with open(path, "wb") as handle:
        os.posix_fallocate(handle.fileno(), 0, size)


def _random_states(model):
    """The model's random-generator state variables (its dropout layers' SeedGenerators)."""
    return [v for v in model.variables if v.path.endswith("seed_generator_state")]


def _restore_random_states(model, info):
    """Sets the random-generator states saved in a checkpoint's JSON (older checkpoints have
    none: the states are then left as they are)."""
    import keras
    import numpy as np

    saved, variables = info.get("random_state"), _random_states(model)
    if not isinstance(saved, list) or len(saved) != len(variables):
        return
    for variable, state in zip(variables, saved):
        variable.assign(keras.ops.convert_to_tensor(np.asarray(state), variable.dtype))


def prune_checkpoints(directory, keep):
    """Deletes all but the newest `keep` checkpoints of `directory`, and weights files older
    than the newest checkpoint whose JSON never came (the writer was killed between the two)."""
    directory = pathlib.Path(directory)
    paths = list_checkpoints(directory)
    for path in paths[:-keep]:
        _delete_step(directory, checkpoint_step(path))
    newest = checkpoint_step(paths[-1]) if paths else None
    for path in directory.glob(f"ckpt-*{WEIGHTS_SUFFIX}"):
        if (_WEIGHTS_FILE.fullmatch(path.name) and not sidecar_path(path).is_file()
                and newest is not None and checkpoint_step(path) < newest):
            path.unlink(missing_ok=True)


def _first_line(error):
    return (str(error).splitlines() or [""])[0][:200]


def _read_sidecar(path):
    """The JSON of checkpoint `path`; DamagedCheckpoint when it does not read."""
    sidecar = sidecar_path(path)
    try:
        info = json.loads(sidecar.read_text(encoding="utf-8"))
        step, position, digest = info["step"], info["data_position"], info["sha256"]
        if not (isinstance(step, int) and isinstance(digest, str)
                and (position is None or isinstance(position, int))
                and isinstance(info.get("state", {}), dict)):
            raise TypeError("step, data_position, sha256 or state has the wrong type")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        raise DamagedCheckpoint(f"{sidecar.name} does not read: {type(error).__name__}: "
                                f"{_first_line(error)}") from None
    return info


def _check(path):
    """The JSON of checkpoint `path` after checking the weights file against it, and the names
    of the datasets in the weights file; DamagedCheckpoint when either is not sound."""
    import h5py

    info = _read_sidecar(path)
    try:
        digest = sha256(path)
    except OSError as error:
        raise DamagedCheckpoint(f"{type(error).__name__}: {_first_line(error)}") from None
    if digest != info["sha256"]:
        raise DamagedCheckpoint(f"its SHA-256 differs from the one in "
                                f"{sidecar_path(path).name}: truncated or corrupt")
    try:
        names = []
        with h5py.File(path, "r") as handle:
            handle.visititems(
                lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None)
    except (OSError, RuntimeError, KeyError, ValueError) as error:
        raise DamagedCheckpoint(f"HDF5 cannot read it: {_first_line(error)}") from None
    return info, names


def _load(model, path, optimizer):
    """Loads checkpoint `path` into `model` (and, with `optimizer`, into its compiled
    optimizer). Returns its JSON. DamagedCheckpoint when it does not read; RunError when it
    does not hold this model's weights (or, with `optimizer`, its optimizer's variables)."""
    info, names = _check(path)
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


def restore_checkpoint(model, path):
    """Restores `model`'s weights and its compiled optimizer's variables from `path`.

    Returns:
        a `Checkpoint`. Raises DamagedCheckpoint when it does not read, RunError when it does
        not match the model.
    """
    info = _load(model, path, optimizer=True)
    _restore_random_states(model, info)
    return Checkpoint(str(path), info["step"], info["data_position"], info.get("state", {}))


def restore_newest(model, directory):
    """Restores `model` (compiled: its optimizer too) from the newest checkpoint of
    `directory` that reads. A damaged one is named in a warning and the one before it is used.

    Returns:
        the `Checkpoint` restored from, or None when there is no readable checkpoint.
    """
    for path in reversed(list_checkpoints(directory)):
        try:
            return restore_checkpoint(model, path)
        except DamagedCheckpoint as error:
            log.warning("checkpoint %s is damaged (%s); using the one before it", path, error)
    return None


def newest_readable(directory):
    """The path of the newest checkpoint of `directory` that reads (the one `restore_newest`
    would restore, checked without loading it), or None."""
    for path in reversed(list_checkpoints(directory)):
        try:
            _check(path)
            return path
        except DamagedCheckpoint:
            continue
    return None


def read_data_position(path):
    """The data position saved with checkpoint `path`, or None when it has none."""
    try:
        return _read_sidecar(path)["data_position"]
    except DamagedCheckpoint as error:
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
    import numpy as np

    total, used = None, []
    for path in paths:
        try:
            _load(model, path, optimizer=False)
        except DamagedCheckpoint as error:
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


def choose_last(paths, last_k, every=1):
    """The last `last_k` of `paths` (oldest first), taking every `every`-th one counting back
    from the newest (every=2: the newest, the third newest, ...); oldest first."""
    if last_k < 1 or every < 1:
        raise ValueError(f"last_k={last_k} and every={every} must be at least 1.")
    return list(paths)[::-1][::every][:last_k][::-1]
