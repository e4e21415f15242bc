"""Keras callbacks of a training run: progress, checkpoints, dev evaluation, stopping, NaN guard.

Each takes `step_fn`, which returns the current optimizer step: under gradient accumulation
Keras' batch counter is not the step.
"""

import logging
import math
import time

import keras
import numpy as np
from keras import ops
from tqdm import tqdm

from keras_transformer.errors import UserError
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
    """Saves a checkpoint of the run every `minutes` of training and/or every `steps` optimizer
    steps, and at the end (`Run.save_checkpoint`: weights, optimizer state, step, data position).

    Args:
        run: the `Run` that saves.
        step_fn: returns the current optimizer step (an int).
        minutes: wall-clock interval (paper: 10); None to save by steps only.
        steps: step interval; None to save by time only.
        keep: how many checkpoints to keep (None: all).
        data_position: called with the number of batches trained on since `fit` began, returns
            the data position to save (None: none is saved). Under gradient accumulation a
            save can fall between updates: the optimizer then holds the gradients of the
            batches since the last update, and the batch count includes them.
        directory: where to save instead of the run's checkpoints (a non-chief worker's).
        state: returns the training state to save with each checkpoint (a JSON-able dict: the
            early-stopping counters), or None.
    """

    def __init__(self, run, step_fn, minutes=10.0, steps=None, keep=None, data_position=None,
                 directory=None, state=None):
        super().__init__()
        self.run, self.step_fn, self.data_position = run, step_fn, data_position
        self.state = state
        self.minutes, self.steps, self.keep, self.directory = minutes, steps, keep, directory
        self.last_time = time.monotonic()
        self.last_step = None
        self.last_state = None  # the training state saved with it
        self.last_path = None  # of the newest checkpoint this callback saved
        self.batches = 0

    def save(self, reason):
        """Saves a checkpoint now, unless one was saved at this step with the same training
        state (an evaluation after the save may change it: the checkpoint is then saved
        again); returns its path (or None when none was saved)."""
        step = self.step_fn()
        state = self.state() if self.state else None
        if step == self.last_step and state == self.last_state:
            return None
        position = None if self.data_position is None else self.data_position(self.batches)
        path = self.run.save_checkpoint(self.model, step, position, keep=self.keep,
                                        directory=self.directory, state=state)
        self.last_step, self.last_time, self.last_path = step, time.monotonic(), path
        self.last_state = state
        log.info("checkpoint %s (step %d, %s)", path, step, reason)
        return path

    def on_train_begin(self, logs=None):
        # Nothing to save before the first update (a resumed run has its checkpoint already;
        # under accumulation the first batches leave the step at 0).
        self.last_step = self.step_fn()
        self.last_state = self.state() if self.state else None

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        step = self.step_fn()
        if self.steps and step % self.steps == 0:
            self.save(f"every {self.steps} steps")
        elif self.minutes and time.monotonic() - self.last_time >= 60 * self.minutes:
            self.save(f"every {self.minutes:g} minutes")

    def on_train_end(self, logs=None):
        self.save("end of training")


class Validation(keras.callbacks.Callback):
    """Dev loss, perplexity and token accuracy at the end of every Keras epoch (eval_steps).

    `results(step)` gives the figures at a step, reusing the pass made at the end of the last
    epoch when it was made at that step. The dev batches are a tf.data.Dataset or a list of
    numpy batches; the pass is compiled: on TensorFlow one tf.function traced once for any
    batch shape of a dataset, on JAX a jax.jit of the model's stateless call (one compilation
    per batch shape).
    """

    def __init__(self, dataset, loss, step_fn):
        super().__init__()
        self.dataset, self.loss, self.step_fn = dataset, loss, step_fn
        self._step = None
        self.last = (None, None)  # (step, results) of the latest pass
        self.enabled = True  # False: no pass at the epoch's end (a preempted run's last)

    def _sums(self, logits, labels):
        """(loss x tokens, tokens, summed NLL, right argmaxes) of one batch."""
        mask = ops.cast(ops.not_equal(labels, PAD_ID), "float32")
        tokens = ops.sum(mask)
        nll = ops.sum(smoothed_token_losses(labels, logits, 0.0) * mask)
        right = ops.sum(ops.cast(ops.equal(ops.argmax(logits, axis=-1),
                                           ops.cast(labels, "int32")), "float32") * mask)
        return ops.stack([self.loss(labels, logits) * tokens, tokens, nll, right])

    def _compiled(self):
        if self._step is not None:
            return self._step
        model = self.model
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

    def evaluate(self):
        step = self._compiled()
        totals = np.zeros(4, np.float64)
        for inputs, labels in self.dataset:
            totals += step(inputs, labels)
        loss, tokens, nll, right = totals
        tokens = max(tokens, 1.0)
        results = {"val_loss": loss / tokens,
                   "val_perplexity": math.exp(min(nll / tokens, 50.0)),
                   "val_token_accuracy": right / tokens}
        self.last = (self.step_fn(), results)
        return results

    def results(self):
        """The dev figures at the current step (one pass per step at most)."""
        step, results = self.last
        return results if step == self.step_fn() else self.evaluate()

    def on_epoch_end(self, epoch, logs=None):
        if not self.enabled:
            return
        results = self.evaluate()
        if logs is not None:
            logs.update(results)
        _say(f"step {self.step_fn()}: validation: "
             + ", ".join(f"{k} {v:.4f}" for k, v in results.items()))


class DevBleu(keras.callbacks.Callback):
    """sacreBLEU and chrF of greedy translations of the first dev sentences, every `every`
    steps. `history` holds (step, BLEU, chrF) of every pass, `last` (step, {"bleu", "chrf"})
    of the latest."""

    def __init__(self, tokenizer, sources_text, references, every, step_fn, max_length):
        super().__init__()
        self.tokenizer, self.sources, self.references = tokenizer, sources_text, references
        self.every, self.step_fn, self.max_length = every, step_fn, max_length
        self._translator = None
        self.history = []
        self.last = (None, None)

    def on_train_batch_end(self, batch, logs=None):
        step = self.step_fn()
        if step % self.every or (self.history and self.history[-1][0] == step):
            return
        self.evaluate()

    def evaluate(self):
        """Translates and scores now; returns {"bleu", "chrf"}."""
        import sacrebleu

        from keras_transformer.decoding.decoder import Decoder
        from keras_transformer.decoding.request import Request

        if self._translator is None:
            self._translator = Decoder(Request(beam_size=1)).engine(
                self.model, self.tokenizer, self.max_length)
        step = self.step_fn()
        hypotheses = self._translator.translate(self.sources)
        bleu = sacrebleu.corpus_bleu(hypotheses, [self.references])
        chrf = sacrebleu.corpus_chrf(hypotheses, [self.references])
        self.history.append((step, bleu.score, chrf.score))
        self.last = (step, {"bleu": bleu.score, "chrf": chrf.score})
        _say(f"step {step}: dev BLEU (greedy, {len(self.sources)} sentences) {bleu.score:.2f}, "
             f"chrF {chrf.score:.2f}")
        return self.last[1]


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
    """Stops training with a clear message when the loss becomes NaN or infinite."""

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
