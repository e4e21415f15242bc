"""TensorBoard events of a training run, by optimizer step, on TensorFlow and JAX.

    RUN/logs/train   loss (the mean training loss of the batches since the last point),
                     learning_rate, tokens_per_s (source + target), every `log_steps` steps;
                     config (the effective config, text) once, where this process starts
    RUN/logs/dev     loss, perplexity, token_accuracy at each evaluation (eval_steps);
                     bleu (and chrf, where the run computes it) at each greedy dev
                     translation (bleu_steps)

The x axis is the optimizer step (under --grad-accum-steps an update, not a batch), not
Keras' epochs or batch counts. The events are written with the `tensorboard` package's event
writer and summary protos, which need no TensorFlow graph and take plain numbers: the same
code runs on the JAX backend. (The writer uses TensorFlow's file layer where TensorFlow is
installed and its own otherwise.) Where the `tensorboard` package is missing the run says so
once and trains without events.

Each training process writes a SessionLog START at the step after the one it starts from.
TensorBoard takes a run's first START as its beginning and every later one as a restart: it
drops the points an earlier process wrote at that step or later, which a resumed run trains
again from its checkpoint, so each step appears once (TensorBoard's own rule for restarts).
The config is written by each process at its start step (a resumed run may have changed
some settings).
"""

import logging
import time

import keras

from keras_transformer.training.events import EVALUATED

log = logging.getLogger(__name__)


def _writer_parts():
    """(EventFileWriter, event_pb2, scalar_pb, text_pb) from the tensorboard package, or None
    where it is not installed."""
    try:
        from tensorboard.compat.proto import event_pb2
        from tensorboard.plugins.scalar.summary_v2 import scalar_pb
        from tensorboard.plugins.text.summary_v2 import text_pb
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:
        return None
    return EventFileWriter, event_pb2, scalar_pb, text_pb


class _Writer:
    """One event file in `directory`: scalars and text at a step."""

    def __init__(self, directory, parts):
        file_writer, self._event_pb2, self._scalar_pb, self._text_pb = parts
        directory.mkdir(parents=True, exist_ok=True)
        self._file = file_writer(str(directory), flush_secs=30)

    def _add(self, step, **fields):
        self._file.add_event(self._event_pb2.Event(wall_time=time.time(), step=int(step),
                                                   **fields))

    def scalars(self, step, values):
        for tag, value in values.items():
            self._add(step, summary=self._scalar_pb(tag, float(value)))

    def text(self, step, tag, text):
        self._add(step, summary=self._text_pb(tag, text))

    def restart(self, step):
        """Marks a (re)start at `step`: TensorBoard drops the points written before it at
        `step` and later (all but the first such mark of a run)."""
        self._add(step, session_log=self._event_pb2.SessionLog(
            status=self._event_pb2.SessionLog.START))

    def close(self):
        self._file.flush()
        self._file.close()


def _loss_sums(model):
    """(total, count) of Keras' running training-loss mean, from the values `fit` holds now
    (under JAX `fit` keeps them in its own state between syncs); None without a tracker."""
    tracker = getattr(model, "_loss_tracker", None)
    if tracker is None:
        return None
    variables = [tracker.total, tracker.count]
    state = getattr(model, "_jax_state", None)
    if state and state.get("metrics_variables"):
        paths = [v.path for v in model.metrics_variables]
        values = [state["metrics_variables"][paths.index(v.path)] for v in variables]
    else:
        values = [v.value for v in variables]
    return tuple(float(keras.ops.convert_to_numpy(value)) for value in values)


class TensorBoardLog(keras.callbacks.Callback):
    """Writes the run's TensorBoard events by optimizer step (see the module's docstring).

    It writes the dev evaluations of the run's `Evaluations` (those of this process: not a
    pass a resumed run owed), in the hook they were published in.

    Args:
        logs_dir: returns the folder of a split ("train", "dev"): `Run.logs_dir`.
        step_fn: returns the current optimizer step.
        log_steps: training figures every N optimizer steps.
        tokens: returns the source + target tokens handed to training so far (or None).
        read_loss_tracker: log the exact mean loss of the batches since the last point, read
            from Keras' loss tracker (False under MultiWorkerMirroredStrategy: see __init__).
        config_text: the effective config, written once at the start (or None).
        evaluations: the run's `Evaluations` (or None): every evaluation goes to dev.
    """

    needs = (EVALUATED,)

    def __init__(self, logs_dir, step_fn, log_steps, tokens=None, config_text=None,
                 evaluations=None, read_loss_tracker=True):
        super().__init__()
        # Under MultiWorkerMirroredStrategy the loss tracker's variables are read by an
        # all-reduce that every worker must join; this callback runs on the chief alone, so
        # there it logs Keras' reduced `logs["loss"]` (the epoch's running mean) instead.
        self.read_loss_tracker = read_loss_tracker
        self.logs_dir, self.step_fn, self.log_steps = logs_dir, step_fn, log_steps
        self.tokens, self.config_text = tokens, config_text
        self.evaluations = evaluations
        self.writers = {}

    def on_train_begin(self, logs=None):
        parts = _writer_parts()
        if parts is None:
            print("TensorBoard: the tensorboard package is not installed; training goes on "
                  "without events (pip install tensorboard)", flush=True)
            return
        self.writers = {split: _Writer(self.logs_dir(split), parts)
                        for split in ("train", "dev")}
        start = self.step_fn()
        for writer in self.writers.values():  # a restart, if an earlier process wrote here
            writer.restart(start + 1)
        if self.config_text:
            # Markdown: indented, so that TensorBoard keeps the lines as they are.
            self.writers["train"].text(start, "config", "\n".join(
                "    " + line for line in self.config_text.splitlines()))
        self._last_step = start
        self._last_time = time.monotonic()
        self._last_tokens = self.tokens() if self.tokens is not None else None
        self._sums = (0.0, 0.0)  # the loss tracker's (total, count) at the last point
        self._carried = (0.0, 0.0)  # of the batches of earlier epochs since the last point
        self._written = 0  # of the evaluations (a fine-tuned run's pass before training too)

    def on_epoch_begin(self, epoch, logs=None):
        self._sums = (0.0, 0.0)  # Keras resets its metrics when an epoch begins

    def on_train_batch_end(self, batch, logs=None):
        if not self.writers:
            return
        step = self.step_fn()
        if step > self._last_step and step % self.log_steps == 0:
            self._write_training(step, logs)
        self._write_dev()

    def on_epoch_end(self, epoch, logs=None):
        if not self.writers:
            return
        sums = _loss_sums(self.model) if self.read_loss_tracker else None
        if sums is not None:  # carry this epoch's batches since the last point
            self._carried = tuple(c + s - p for c, s, p in zip(self._carried, sums, self._sums))
        self._write_dev()

    def on_train_end(self, logs=None):
        self._write_dev()
        for writer in self.writers.values():
            writer.close()
        self.writers = {}

    def _write_training(self, step, logs):
        values = {}
        sums = _loss_sums(self.model) if self.read_loss_tracker else None
        if sums is not None:
            total, count = (c + s - p for c, s, p in zip(self._carried, sums, self._sums))
            if count > 0:
                values["loss"] = total / count
            self._sums, self._carried = sums, (0.0, 0.0)
        elif logs and "loss" in logs:
            values["loss"] = float(logs["loss"])
        optimizer = self.model.optimizer
        schedule = getattr(optimizer, "_learning_rate", None)
        if callable(schedule):
            values["learning_rate"] = keras.ops.convert_to_numpy(schedule(step))
        elif schedule is not None:
            values["learning_rate"] = keras.ops.convert_to_numpy(optimizer.learning_rate)
        now = time.monotonic()
        if self.tokens is not None:
            tokens = self.tokens()
            values["tokens_per_s"] = (tokens - self._last_tokens) / max(now - self._last_time,
                                                                        1e-9)
            self._last_tokens = tokens
        self._last_step, self._last_time = step, now
        self.writers["train"].scalars(step, values)

    def _write_dev(self):
        if not self.writers or self.evaluations is None:
            return
        history = self.evaluations.history
        for evaluation in history[self._written:]:
            self.writers["dev"].scalars(evaluation.step, _dev_values(evaluation))
        self._written = len(history)


def _dev_values(evaluation):
    """The `logs/dev` scalars of an evaluation: loss, perplexity, token_accuracy or bleu,
    chrf; a run of several pairs adds each pair's ("en-fr/loss", "en-fr/bleu")."""
    figures = evaluation.figures
    if evaluation.kind == "loss":
        values = {"loss": figures["val_loss"], "perplexity": figures["val_perplexity"],
                  "token_accuracy": figures["val_token_accuracy"]}
    else:
        values = {key: figures[key] for key in ("bleu", "chrf") if key in figures}
    for key, value in figures.items():
        if "/" in key:
            pair, name = key.split("/", 1)
            values[f"{pair}/{name.removeprefix('val_')}"] = value
    return values
