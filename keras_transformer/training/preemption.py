"""Checkpoint on a signal: what a preempted job does with its grace period.

Cloud spot VMs, Kubernetes evictions and Slurm send SIGTERM and kill the job some seconds later
(SIGKILL). With `checkpoint_on_signal` (the default), training catches SIGTERM and SIGINT,
finishes the optimizer step it is in, saves a checkpoint with the data position (the same save
as every periodic one: atomic, weights, optimizer state, step, data position), stops, and the
`train` command exits with `EXIT_PREEMPTED`. Running the same command again resumes at that
step with the batches an uninterrupted run would have seen next.

A second signal while the checkpoint is being saved ends the process as the signal would
have without this (SIGTERM: killed; SIGINT: KeyboardInterrupt); the checkpoint being written
is then discarded and the run resumes from the one before.

The handlers are installed only while `model.fit` runs and in the main thread. Under
MultiWorkerMirroredStrategy they are not installed: each worker would stop at its own step and
the others would wait for it in their next all-reduce; a preempted multi-worker job resumes from
its last periodic checkpoint (every checkpoint_steps, default eval_steps).
"""

import logging
import signal
import threading

import keras

from keras_transformer.errors import UserError
from keras_transformer.training.events import CHECKPOINTED, Outcome

log = logging.getLogger(__name__)

# EX_TEMPFAIL of sysexits.h: "a temporary failure; the user is invited to retry". A job
# scheduler can requeue on it (docs/training.md).
EXIT_PREEMPTED = 75

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Preempted(UserError):
    """Training stopped on a signal after saving a checkpoint; the same command resumes it.

    Attributes:
        signal_name: "SIGTERM" or "SIGINT".
        step: the step saved.
        path: the checkpoint's weights file.
    """

    exit_status = EXIT_PREEMPTED

    def __init__(self, signal_name, step, path):
        super().__init__(f"stopped by {signal_name}: checkpoint {path} saved at step {step}; "
                         "run the same command to resume from it")
        self.signal_name, self.step, self.path = signal_name, step, path


class CheckpointOnSignal(keras.callbacks.Callback):
    """On SIGTERM or SIGINT, saves a checkpoint at the end of the current optimizer step
    (through the run's `Checkpointer`, so that the data position is the periodic saves') and
    stops training. It runs after `PeriodicCheckpoint`, so that the batch just trained is
    counted, and closes the run's `Evaluations`: no dev pass at the end of the epoch, the grace
    period is short.

    Args:
        checkpointer: the run's `Checkpointer`.
        step_fn: returns the current optimizer step.
        evaluations: the run's `Evaluations` (or None).
        outcome: the run's `Outcome`: the `Preempted` to raise goes to its `preempted`.
    """

    needs = (CHECKPOINTED,)

    def __init__(self, checkpointer, step_fn, evaluations=None, outcome=None):
        super().__init__()
        self.checkpointer, self.step_fn, self.evaluations = checkpointer, step_fn, evaluations
        self.outcome = outcome if outcome is not None else Outcome()
        self.received = None  # the signal's number, once one came
        self.saved = None  # (step, path) of the checkpoint saved on it
        self._previous = {}
        self._last_step = None

    def _handle(self, signum, frame):
        if self.received is not None:  # a second signal: do what it would have done
            self.restore_handlers()
            signal.raise_signal(signum)
            return
        self.received = signum

    def restore_handlers(self):
        """Puts back the handlers that were there before training (done at the end of
        training; again is harmless)."""
        for signum, handler in self._previous.items():
            # (None: a handler installed from C, which Python cannot put back: the default.)
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self._previous = {}

    def on_train_begin(self, logs=None):
        self._last_step = self.step_fn()
        if threading.current_thread() is not threading.main_thread():
            log.warning("training runs outside the main thread: no checkpoint on SIGTERM")
            return
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)

    def on_train_batch_end(self, batch, logs=None):
        step = self.step_fn()
        finished_step, self._last_step = step != self._last_step, step
        if self.received is None or not finished_step or self.saved:
            return  # under gradient accumulation, the step ends with its last batch
        name = signal.Signals(self.received).name
        # (The periodic checkpoint's path when one fell on this very step.)
        self.saved = (step, self.checkpointer.save(self.model, f"on {name}"))
        self.model.stop_training = True
        self.outcome.preempted = Preempted(name, *self.saved)
        self.outcome.stop(f"stopped by {name}")
        if self.evaluations is not None:
            self.evaluations.close()

    def on_train_end(self, logs=None):
        self.restore_handlers()
