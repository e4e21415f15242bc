"""Keras callbacks of a training run: progress, checkpoints, dev evaluation, stopping, NaN guard.

Each takes `step_fn`, which returns the current optimizer step: under gradient accumulation
Keras' batch counter is not the step. None holds another callback: the dev evaluations go
through the run's `Evaluations`, the checkpoints through its `Checkpointer`, why training
stopped through its `Outcome`, and each declares the topics it `needs` and `gives`
(training/events.py), from which the trainer orders them. The dev figures also go into Keras'
`logs` (val_loss, val_perplexity, val_token_accuracy at the end of each epoch; val_bleu,
val_chrf where the greedy dev translation is made), for the callbacks after ours.

The dev passes themselves are plain objects called with a model (`DevLoss`,
`DevTranslation`): the callbacks decide when, the trainer calls them for the evaluation a
resumed run owes and the figures of its last step.
"""

import logging
import math
import time

import keras
import numpy as np
from keras import ops
from tqdm import tqdm

from keras_transformer.errors import UserError
from keras_transformer.training.events import (CHECKPOINTED, EVALUATED, LOSS_CHECKED,
                                               Outcome)
from keras_transformer.training.loss import smoothed_token_losses
from pipelines.progress import FILE_INTERVAL, progress_bar
from pipelines.special_ids import PAD_ID

log = logging.getLogger(__name__)


class TrainingError(UserError):
    """Training cannot go on; the message says why and what to do."""


def _say(line):
    """Prints a line without breaking an active progress bar."""
    tqdm.write(line)


class Progress(keras.callbacks.Callback):
    """One progress bar over the run's optimizer steps (not Keras' epochs): "step k of
    train_steps", the loss, source + target tokens/s since this process began training, elapsed
    time and an ETA from the measured step rate. A resumed run starts the bar at its step, so
    the rate and the ETA count only the steps trained now.

    Args:
        step_fn: returns the current optimizer step.
        total_steps: the run's train_steps.
        tokens: returns the number of tokens handed to training so far (or None).
        interval: seconds between refreshes (None: 1 s on a terminal, 30 s in a log file).
        file: where to write (default: sys.stderr). A terminal gets tqdm's live bar; a file or a
            pipe gets one complete line per refresh (no carriage returns), so a log reads as
            the run's history.
    """

    def __init__(self, step_fn, total_steps, tokens=None, interval=None, file=None):
        super().__init__()
        self.step_fn, self.total_steps, self.tokens = step_fn, total_steps, tokens
        self.interval, self.file = interval, file
        self.bar = None

    def on_train_begin(self, logs=None):
        import sys

        file = self.file or sys.stderr
        self._start_tokens = self.tokens() if self.tokens is not None else 0
        self._start_time = time.monotonic()
        self.bar = progress_bar(total=self.total_steps, initial=self.step_fn(),
                                desc="training", unit=" steps", file=file,
                                interval=1.0 if self.interval is None else self.interval,
                                file_interval=FILE_INTERVAL if self.interval is None
                                else self.interval,
                                smoothing=0.05, dynamic_ncols=True,
                                bar_format="{desc}: step {n}/{total} ({percentage:3.0f}%) "
                                           "|{bar}| [{elapsed}<{remaining}, {rate_fmt}]"
                                           "{postfix}")

    def on_train_batch_end(self, batch, logs=None):
        step = self.step_fn()
        if step <= self.bar.n:  # between accumulated updates
            return
        self.bar.update(step - self.bar.n)
        now = time.monotonic()
        if now - getattr(self, "_last_postfix", 0.0) >= self.bar.mininterval:
            self._last_postfix = now
            postfix = {}
            if logs and "loss" in logs:
                postfix["loss"] = f"{float(logs['loss']):.3f}"
            if self.tokens is not None:
                tokens = self.tokens() - self._start_tokens
                postfix["tokens/s"] = f"{tokens / max(now - self._start_time, 1e-9):,.0f}"
            self.bar.set_postfix(postfix, refresh=False)

    def on_train_end(self, logs=None):
        if self.bar is not None:
            self.bar.close()


class PeriodicCheckpoint(keras.callbacks.Callback):
    """Saves a checkpoint every `minutes` of training and/or every `steps` optimizer steps, and
    at the end, through the run's `Checkpointer`. Runs after the evaluations of a batch, so
    that a checkpoint saved at a step holds that step's early-stopping counters.

    Args:
        checkpointer: the run's `Checkpointer`.
        minutes: wall-clock interval (paper: 10); None to save by steps only.
        steps: step interval; None to save by time only.
    """

    needs = (LOSS_CHECKED, EVALUATED)
    gives = (CHECKPOINTED,)

    def __init__(self, checkpointer, minutes=10.0, steps=None):
        super().__init__()
        self.checkpointer, self.minutes, self.steps = checkpointer, minutes, steps

    def on_train_begin(self, logs=None):
        self.checkpointer.mark()

    def on_train_batch_end(self, batch, logs=None):
        checkpointer = self.checkpointer
        checkpointer.count_batch()
        if self.steps and checkpointer.step_fn() % self.steps == 0:
            checkpointer.save(self.model, f"every {self.steps} steps")
        elif self.minutes and checkpointer.minutes_since_save() >= self.minutes:
            checkpointer.save(self.model, f"every {self.minutes:g} minutes")

    def on_train_end(self, logs=None):
        self.checkpointer.save(self.model, "end of training")


class DevLoss:
    """One pass over dev batches: loss, perplexity and token accuracy. The batches are a
    tf.data.Dataset or a list of numpy batches; the pass is compiled: on TensorFlow one
    tf.function traced once for any batch shape of a dataset, on JAX a jax.jit of the model's
    stateless call (one compilation per batch shape)."""

    def __init__(self, dataset, loss):
        self.dataset, self.loss = dataset, loss
        self._step = self._model = None

    def _sums(self, logits, labels):
        """(loss x tokens, tokens, summed NLL, right argmaxes) of one batch."""
        mask = ops.cast(ops.not_equal(labels, PAD_ID), "float32")
        tokens = ops.sum(mask)
        nll = ops.sum(smoothed_token_losses(labels, logits, 0.0) * mask)
        right = ops.sum(ops.cast(ops.equal(ops.argmax(logits, axis=-1),
                                           ops.cast(labels, "int32")), "float32") * mask)
        return ops.stack([self.loss(labels, logits) * tokens, tokens, nll, right])

    def _compiled(self, model):
        if self._step is not None and self._model is model:
            return self._step
        self._model = model
        if keras.backend.backend() == "tensorflow":
            import tensorflow as tf

            # One trace for every batch shape: the dataset's structure with unknown sizes
            # (reduce_retracing alone traces twice: the first shape, then a general one).
            spec = getattr(self.dataset, "element_spec", None)
            signature = None if spec is None else [tf.nest.map_structure(
                lambda s: tf.TensorSpec(None if s.shape.rank is None else [None] * s.shape.rank,
                                      s.dtype), part) for part in spec]

            @tf.function(input_signature=signature, reduce_retracing=True, autograph=False)
            def step(inputs, labels):
                return self._sums(model(inputs, training=False), labels)

            self._step = lambda inputs, labels: step(inputs, labels).numpy()
        elif keras.backend.backend() == "jax":
            import jax

            @jax.jit
            def stateless(trainable, non_trainable, inputs, labels):
                logits, _ = model.stateless_call(trainable, non_trainable, inputs,
                                                 training=False)
                return self._sums(logits, labels)

            def step(inputs, labels):
                values = stateless([v.value for v in model.trainable_variables],
                                   [v.value for v in model.non_trainable_variables],
                                   inputs, labels)
                return np.asarray(values)

            self._step = step
        else:
            self._step = lambda inputs, labels: ops.convert_to_numpy(
                self._sums(model(inputs, training=False), labels))
        return self._step

    def __call__(self, model):
        """{"val_loss", "val_perplexity", "val_token_accuracy"} of `model` on the batches."""
        step = self._compiled(model)
        totals = np.zeros(4, np.float64)
        for inputs, labels in self.dataset:
            totals += step(inputs, labels)
        loss, tokens, nll, right = totals
        tokens = max(tokens, 1.0)
        return {"val_loss": loss / tokens,
                "val_perplexity": math.exp(min(nll / tokens, 50.0)),
                "val_token_accuracy": right / tokens}


def _optimizer_step(model):
    """The optimizer step of `model` (the step of a callback used without a `step_fn`)."""
    return int(ops.convert_to_numpy(model.optimizer.iterations))


def as_logs(figures):
    """Keras' names of dev figures: "val_" before each name ("bleu" -> "val_bleu", a pair's
    "en-fr/bleu" -> "en-fr/val_bleu"); names with it already stay."""
    logs = {}
    for key, value in figures.items():
        pair, _, name = key.rpartition("/")
        name = name if name.startswith("val_") else f"val_{name}"
        logs[f"{pair}/{name}" if pair else name] = float(value)
    return logs


class Validation(keras.callbacks.Callback):
    """Dev loss, perplexity and token accuracy at the end of every Keras epoch (eval_steps),
    put in the epoch's `logs` (val_loss, val_perplexity, val_token_accuracy) and published to
    the run's `Evaluations` (kind "loss").

    Args:
        dev_loss: the pass over the dev batches: a `DevLoss` (or a run of several pairs'
            `PairDevLoss`), called with the model.
        step_fn: returns the current optimizer step (None: the optimizer's `iterations`).
        evaluations: the run's `Evaluations` (None: the figures go to Keras' logs only).
    """

    gives = (EVALUATED,)
    needs = (LOSS_CHECKED,)
    kind = "loss"

    def __init__(self, dev_loss, step_fn=None, evaluations=None):
        super().__init__()
        self.dev_loss, self.step_fn, self.evaluations = dev_loss, step_fn, evaluations

    def on_epoch_end(self, epoch, logs=None):
        if self.evaluations is not None and self.evaluations.closed:
            return
        step = self.step_fn() if self.step_fn else _optimizer_step(self.model)
        figures = self.dev_loss(self.model)
        if logs is not None:
            logs.update(figures)
        _say(f"step {step}: validation: " + ", ".join(f"{k} {v:.4f}" for k, v in figures.items()))
        if self.evaluations is not None:
            self.evaluations.publish(self.kind, step, figures)


class DevTranslation:
    """sacreBLEU and chrF of greedy translations of dev sentences, called with a model:
    ({"bleu", "chrf"}, the line to print) (the greedy translator is made once per model).

    Args:
        tokenizer: the run's vocabulary.
        texts: (source texts, references).
        max_length: inputs are cut at this many tokens.
    """

    def __init__(self, tokenizer, texts, max_length):
        self.tokenizer, self.texts, self.max_length = tokenizer, texts, max_length
        self._translator = self._model = None

    def __call__(self, model):
        """(figures, the line to print) of `model`'s translations."""
        from keras_transformer.decoding.decoder import greedy_translator

        if self._translator is None or self._model is not model:
            self._model = model
            self._translator = greedy_translator(model, self.tokenizer, self.max_length)
        return self.score(self._translator)

    def score(self, translator):
        """({"bleu", "chrf"}, the line to print) of the translations of the dev texts."""
        import sacrebleu

        sources, references = self.texts
        hypotheses = translator.translate(sources)
        bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
        chrf = sacrebleu.corpus_chrf(hypotheses, [references]).score
        return ({"bleu": bleu, "chrf": chrf},
                f"dev BLEU (greedy, {len(sources)} sentences) {bleu:.2f}, chrF {chrf:.2f}")


class DevBleu(keras.callbacks.Callback):
    """The greedy dev translation's BLEU and chrF every `every` optimizer steps, in Keras'
    `logs` as val_bleu and val_chrf (a run of several pairs: the means, and "en-fr/val_bleu"
    for each pair) and published to the run's `Evaluations` (kind "translation").

    The figures are in the logs of the batch whose step they were computed at, and in the
    logs of the end of that Keras epoch (eval_steps steps): the latest of the epoch, none when
    the epoch had no translation. So a callback after this one, a caller's, sees them where
    they are computed: Keras' CSVLogger, EarlyStopping(monitor="val_bleu", mode="max") and
    ModelCheckpoint(monitor="val_bleu") read them at the epoch's end.

    Args:
        translation: the `DevTranslation` (or a run of several pairs' `PairDevTranslation`).
        every: the interval in optimizer steps.
        step_fn: returns the current optimizer step (None: the optimizer's `iterations`).
        evaluations: the run's `Evaluations` (None: the figures go to Keras' logs only).
    """

    gives = (EVALUATED,)
    needs = (LOSS_CHECKED,)
    kind = "translation"

    def __init__(self, translation, every, step_fn=None, evaluations=None):
        super().__init__()
        self.translation, self.every = translation, every
        self.step_fn, self.evaluations = step_fn, evaluations
        self._last_step = None
        self._epoch_logs = {}  # of the latest translation in this Keras epoch

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_logs = {}

    def on_train_batch_end(self, batch, logs=None):
        step = self.step_fn() if self.step_fn else _optimizer_step(self.model)
        if step % self.every or step == self._last_step or (
                self.evaluations is not None and self.evaluations.closed):
            return
        self._last_step = step
        figures, line = self.translation(self.model)
        _say(f"step {step}: {line}")
        self._epoch_logs = as_logs(figures)
        if logs is not None:
            logs.update(self._epoch_logs)
        if self.evaluations is not None:
            self.evaluations.publish(self.kind, step, figures)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.update(self._epoch_logs)


class StopAt(keras.callbacks.Callback):
    """Stops at `train_steps` optimizer steps or after `minutes` of training, and notes why in
    the run's `Outcome` (with the time the first batch ended: under XLA, after its
    compilation)."""

    def __init__(self, train_steps, step_fn, minutes=None, outcome=None):
        super().__init__()
        self.train_steps, self.step_fn, self.minutes = train_steps, step_fn, minutes
        self.outcome = outcome if outcome is not None else Outcome()
        self.start = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        now = time.monotonic()
        self.outcome.batch_ended(now)
        reason = None
        if self.step_fn() >= self.train_steps:
            reason = f"reached train_steps={self.train_steps}"
        elif self.minutes and now - self.start >= 60 * self.minutes:
            reason = f"time limit of {self.minutes:g} minutes"
        if reason:
            self.outcome.stop(reason)
            self.model.stop_training = True


class NanGuard(keras.callbacks.Callback):
    """Stops training with a clear message when the loss becomes NaN or infinite, before the
    batch's weights are evaluated or saved."""

    gives = (LOSS_CHECKED,)

    def __init__(self, step_fn):
        super().__init__()
        self.step_fn = step_fn

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.model.stop_training = True
            raise TrainingError(
                f"Loss became {float(loss)} at step {self.step_fn()}. Training stopped; the "
                "last good checkpoint is kept. Lower the learning rate (lr_scale), raise "
                "warmup_steps, or use float32 precision, then restart."
            )
