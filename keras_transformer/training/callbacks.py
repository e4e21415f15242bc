"""Keras callbacks of a training run: progress, checkpoints, dev evaluation, stopping, NaN guard.

Each takes `step_fn`, which returns the current optimizer step: under gradient accumulation
Keras' batch counter is not the step. None holds another callback: the dev evaluations go
through the run's `Evaluations`, the checkpoints through its `Checkpointer`, and each
declares the topics it `needs` and `gives` (training/events.py), from which the trainer
orders them.
"""

import logging
import math
import time

import keras
import numpy as np
from keras import ops
from tqdm import tqdm

from keras_transformer.errors import UserError
from keras_transformer.training.events import CHECKPOINTED, EVALUATED, LOSS_CHECKED
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


class Validation(keras.callbacks.Callback):
    """Dev loss, perplexity and token accuracy at the end of every Keras epoch (eval_steps),
    published to the run's `Evaluations` (kind "loss").

    `results()` gives the figures at the current step, reusing the pass made at the end of the
    last epoch when it was made at that step (a pass made there is not published).

    Args:
        dataset: the dev batches (`DevLoss`).
        loss: the training loss (the dev loss is computed with the same label smoothing).
        step_fn: returns the current optimizer step.
        evaluations: the run's `Evaluations` (None: the figures are only returned).
    """

    gives = (EVALUATED,)
    needs = (LOSS_CHECKED,)
    kind = "loss"

    def __init__(self, dataset, loss, step_fn, evaluations=None):
        super().__init__()
        self.dataset, self.loss, self.step_fn = dataset, loss, step_fn
        self.evaluations = evaluations
        self._pass = DevLoss(dataset, loss)
        self._last = (None, None)  # (step, figures) of the latest pass, owed ones left out

    def figures(self):
        """The figures of one pass now."""
        return self._pass(self.model)

    def evaluate(self, owed=False):
        """Makes a pass now and publishes it; returns its figures."""
        step, figures = self.step_fn(), self.figures()
        self._publish(step, figures, owed)
        return figures

    def _publish(self, step, figures, owed=False):
        if not owed:
            self._last = (step, figures)
        if self.evaluations is not None:
            self.evaluations.publish(self.kind, step, figures, owed=owed)

    def results(self):
        """The dev figures at the current step (one pass per step at most)."""
        step, figures = self._last
        if step != self.step_fn():
            figures = self.figures()
            self._last = (self.step_fn(), figures)
        return figures

    def on_epoch_end(self, epoch, logs=None):
        if self.evaluations is not None and self.evaluations.closed:
            return
        step, figures = self.step_fn(), self.figures()
        if logs is not None:
            logs.update(figures)
        _say(f"step {step}: validation: " + ", ".join(f"{k} {v:.4f}" for k, v in figures.items()))
        self._publish(step, figures)


class DevBleu(keras.callbacks.Callback):
    """sacreBLEU and chrF of greedy translations of the first dev sentences, every `every`
    steps, published to the run's `Evaluations` (kind "translation").

    Args:
        tokenizer: the run's vocabulary.
        texts: (source texts, references).
        every: the interval in optimizer steps.
        step_fn: returns the current optimizer step.
        max_length: inputs are cut at this many tokens.
        evaluations: the run's `Evaluations`.
    """

    gives = (EVALUATED,)
    needs = (LOSS_CHECKED,)
    kind = "translation"

    def __init__(self, tokenizer, texts, every, step_fn, max_length, evaluations=None):
        super().__init__()
        self.tokenizer, self.texts, self.every = tokenizer, texts, every
        self.step_fn, self.max_length, self.evaluations = step_fn, max_length, evaluations
        self._translator = None
        self._last_step = None

    def on_train_batch_end(self, batch, logs=None):
        step = self.step_fn()
        if step % self.every or step == self._last_step or (
                self.evaluations is not None and self.evaluations.closed):
            return
        self.evaluate()

    def score(self, translator):
        """({"bleu", "chrf"}, the line to print) of the translations of the dev texts."""
        import sacrebleu

        sources, references = self.texts
        hypotheses = translator.translate(sources)
        bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
        chrf = sacrebleu.corpus_chrf(hypotheses, [references]).score
        return ({"bleu": bleu, "chrf": chrf},
                f"dev BLEU (greedy, {len(sources)} sentences) {bleu:.2f}, chrF {chrf:.2f}")

    def evaluate(self, owed=False):
        """Translates and scores now, publishes the figures and returns them."""
        from keras_transformer.decoding.decoder import greedy_translator

        if self._translator is None:
            self._translator = greedy_translator(self.model, self.tokenizer, self.max_length)
        step = self.step_fn()
        figures, line = self.score(self._translator)
        self._last_step = step
        _say(f"step {step}: {line}")
        if self.evaluations is not None:
            self.evaluations.publish(self.kind, step, figures, owed=owed)
        return figures


class StopAt(keras.callbacks.Callback):
    """Stops at `train_steps` optimizer steps or after `minutes` of training. Keeps when the
    first batch ended (`first_batch_end`, time.monotonic()): under XLA, after its compilation."""

    def __init__(self, train_steps, step_fn, minutes=None):
        super().__init__()
        self.train_steps, self.step_fn, self.minutes = train_steps, step_fn, minutes
        self.start = time.monotonic()
        self.reason = self.first_batch_end = None

    def on_train_batch_end(self, batch, logs=None):
        if self.first_batch_end is None:
            self.first_batch_end = time.monotonic()
        if self.step_fn() >= self.train_steps:
            self.reason = f"reached train_steps={self.train_steps}"
        elif self.minutes and time.monotonic() - self.start >= 60 * self.minutes:
            self.reason = f"time limit of {self.minutes:g} minutes"
        if self.reason:
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
