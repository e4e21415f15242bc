"""Checkpoints: periodic saving (by time and/or steps), resume, and checkpoint averaging.

Checkpoints are TensorFlow object checkpoints (`tf.train.Checkpoint`) of the model and the
optimizer (weights, Adam moments, step). TensorFlow writes each one under a temporary name and
renames it, and the `checkpoint` index file only names finished ones, so a run killed mid-save
resumes from the last complete checkpoint.
"""

import logging
import pathlib
import time

import keras
import numpy as np
import tensorflow as tf

log = logging.getLogger(__name__)


def checkpoint_dir(run_dir):
    return pathlib.Path(run_dir) / "checkpoints"


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


def make_manager(model, optimizer, directory, keep):
    checkpoint = training_checkpoint(model, optimizer)
    manager = tf.train.CheckpointManager(checkpoint, str(directory), max_to_keep=keep)
    return checkpoint, manager


class PeriodicCheckpoint(keras.callbacks.Callback):
    """Saves every `minutes` of training and/or every `steps` optimizer steps, and at the end.

    Args:
        manager: a `tf.train.CheckpointManager` (keeps the last K).
        step_fn: returns the current optimizer step (an int).
        minutes: wall-clock interval (paper: 10); None to save by steps only.
        steps: step interval; None to save by time only.
    """

    def __init__(self, manager, step_fn, minutes=10.0, steps=None):
        super().__init__()
        self.manager, self.step_fn = manager, step_fn
        self.minutes, self.steps = minutes, steps
        self.last_time = time.monotonic()
        self.last_step = None

    def save(self, reason):
        step = self.step_fn()
        if step == self.last_step:
            return
        path = self.manager.save(checkpoint_number=step)
        self.last_step, self.last_time = step, time.monotonic()
        log.info("checkpoint %s (step %d, %s)", path, step, reason)

    def on_train_batch_end(self, batch, logs=None):
        step = self.step_fn()
        if self.steps and step % self.steps == 0:
            self.save(f"every {self.steps} steps")
        elif self.minutes and time.monotonic() - self.last_time >= 60 * self.minutes:
            self.save(f"every {self.minutes:g} minutes")

    def on_train_end(self, logs=None):
        self.save("end of training")


def average_checkpoints(model, paths):
    """Sets `model`'s weights to the element-wise mean of its weights in `paths`.

    Only the model is read from each checkpoint (optimizer state is ignored).
    """
    if not paths:
        raise ValueError("No checkpoints to average.")
    checkpoint = training_checkpoint(model)
    total = None
    for path in paths:
        # Every model weight must be found; the optimizer's variables are ignored.
        try:
            checkpoint.read(str(path)).expect_partial().assert_existing_objects_matched()
        except AssertionError:
            # Checkpoint keys spell "/" inside a name as ".S".
            stored = {name.split("/.ATTRIBUTES")[0].replace(".S", "/")
                      for name, _ in tf.train.list_variables(str(path))}
            missing = [key for key in model_variables(model) if f"model/{key}" not in stored]
            raise ValueError(
                f"{path} does not hold every weight of this model ({len(missing)} missing, "
                f"e.g. {missing[:2]}): it comes from another architecture or from an older "
                "keras-transformer whose checkpoints were incomplete.") from None
        weights = [w.astype(np.float64) for w in model.get_weights()]
        total = weights if total is None else [t + w for t, w in zip(total, weights)]
    mean = [(t / len(paths)) for t in total]
    model.set_weights([m.astype(w.dtype) for m, w in zip(mean, model.get_weights())])
    return model


def latest_checkpoints(run_dir, last):
    """Paths of the last `last` checkpoints of a run, oldest first."""
    directory = checkpoint_dir(run_dir)
    state = tf.train.get_checkpoint_state(str(directory))
    if state is None or not state.all_model_checkpoint_paths:
        raise ValueError(f"No checkpoints found in {directory}.")
    paths = list(state.all_model_checkpoint_paths)
    if last > len(paths):
        log.warning("Asked to average %d checkpoints; %s has only %d.", last, directory,
                    len(paths))
    return paths[-last:]
