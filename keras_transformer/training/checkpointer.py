"""The run's checkpoints during training: one owner (`Checkpointer`) of what the newest holds,
through which the periodic saves and the signal handler save."""

import logging
import time

log = logging.getLogger("keras_transformer.training.callbacks")  # the log training shows


class Checkpointer:
    """Saves the run's checkpoints (`Run.save_checkpoint`: weights, optimizer state, step, data
    position, training state) and owns what the newest one holds; `PeriodicCheckpoint` and
    `CheckpointOnSignal` save through it.

    Args:
        run: the `Run` that saves.
        step_fn: returns the current optimizer step (an int).
        keep: how many checkpoints to keep (None: all).
        data_position: called with the number of batches trained on since `fit` began, returns
            the data position to save (None: none is saved). Under gradient accumulation a
            save can fall between updates: the optimizer then holds the gradients of the
            batches since the last update, and the batch count includes them.
        directory: where to save instead of the run's checkpoints (a non-chief worker's).
        state: returns the training state to save with each checkpoint (a JSON-able dict: the
            early-stopping counters, `Evaluations.state`), or None.
    """

    def __init__(self, run, step_fn, keep=None, data_position=None, directory=None, state=None):
        self.run, self.step_fn, self.keep = run, step_fn, keep
        self.data_position, self.directory, self.state = data_position, directory, state
        self.batches = 0  # trained on since `fit` began
        self.last_time = time.monotonic()
        self.last_step = None
        self.last_state = None  # the training state saved with it
        self.last_path = None  # of the newest checkpoint saved here

    def _state(self):
        return self.state() if self.state else None

    def mark(self):
        """Takes the current step and state as saved: nothing to save before the first update
        (a resumed run has its checkpoint already; under accumulation the first batches leave
        the step at 0)."""
        self.last_step, self.last_state = self.step_fn(), self._state()

    def count_batch(self):
        """One more batch trained on: the data position of the next save counts it."""
        self.batches += 1

    def minutes_since_save(self):
        return (time.monotonic() - self.last_time) / 60

    def save(self, model, reason):
        """Saves a checkpoint of `model` now, unless one was saved at this step with the same
        training state (an evaluation after the save may change it: the checkpoint is then
        saved again); returns the path of the newest checkpoint (None when none was saved
        here). In `fit`, `model` is a callback's `model`: under JAX reading it brings the
        variables' values of `fit`'s own state back into the model."""
        step, state = self.step_fn(), self._state()
        if step == self.last_step and state == self.last_state:
            return self.last_path
        position = None if self.data_position is None else self.data_position(self.batches)
        path = self.run.save_checkpoint(model, step, position, keep=self.keep,
                                        directory=self.directory, state=state)
        self.last_step, self.last_time, self.last_path = step, time.monotonic(), path
        self.last_state = state
        log.info("checkpoint %s (step %d, %s)", path, step, reason)
        return path
