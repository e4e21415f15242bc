"""Greedy search, and the one search body per mode.

Each mode has one body that builds the step (`step.model_step`) and runs its loop on a model,
with the prefix, the n-best and the empty-row rules (`rules`) inside: `translate_greedy`
(here), `beam_search.translate_beam`, `sampling.translate_sample` and `scoring.score_ids`.
Every caller runs these: `Translator` through the `compiled_*` functions, the SavedModel
signatures (`export.graph`) and the TFLite graph (`export.tflite`); they differ only in what is
specific to them (compilation, checks of a request, tokenization). The bodies return the n-best
layout, `{"ids": (B, H, T), "scores": (B, H), ...}`, and take their options as Python values or
scalar tensors (a signature's inputs).

The searches are written once in `keras.ops` and run on every backend:

* TensorFlow: one `tf.function` for any batch shape, with shapes that follow the values (the
  cache and output buffer hold max(limits) positions, the output keeps the steps taken), or,
  with `jit_compile`, the loop compiled by XLA once per input shape. The exports build their
  graphs from the same bodies.
* JAX: `jax.jit`, compiled once per input shape. Every shape inside the loop is static there
  (a body's `static=True`): the cache and output buffer hold `step.static_max_length` positions
  (padded source width + extra_length) while each sentence's limit stays exact (a value); the
  all-padding columns are cut afterwards, outside the compiled function (`rules.trim`).
"""

import keras
from keras import ops

from keras_transformer.decoding.search.compact import default_shape
from keras_transformer.decoding.search.compiling import compile_search
from keras_transformer.decoding.search.modes import LoopShape
from keras_transformer.decoding.search.repetition import NGRAM_OFF, PENALTY_OFF, repetition
from keras_transformer.decoding.search.rules import finish, mask_special_tokens, prefix_forcing, trim
from keras_transformer.decoding.search.step import EXTRA_LENGTH, prefixed_step, tile_beams
from pipelines.special_ids import BOS_ID, EOS_ID, PAD_ID


def argmax(x):
    """Index (int32) of the largest value on the last axis, the first of equals.

    On TensorFlow its own argmax: `ops.argmax` adds a pass over (N, V) on every step that tells
    -0.0 from 0.0 (never needed for log-probabilities), with a bitcast that TFLite's builtin
    ops lack; `top_k(x, 1)` sorts under XLA. Other backends fuse that pass into the argmax.
    """
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.argmax(x, axis=-1, output_type=tf.int32)
    return ops.cast(ops.argmax(x, axis=-1), "int32")


def greedy_search(step_fn, state, limits, max_length=None, min_length=None, keep_width=False,
                  prefix=None, pick=None, shape=LoopShape, controls=None, rows_per_sentence=1):
    """Picks the next token of every row by a rule, one step at a time: the most likely one
    (greedy search) unless `pick` says otherwise (`decoding.search.sampling.RandomSampler` draws it).

    Args:
        step_fn, state: as described in the module docstring (N = batch rows).
        limits: (N,) maximum output lengths; EOS is forced at the last allowed position.
        max_length: number of steps at most (default max(limits); required where shapes are
            static, e.g. under JAX: a Python int).
        min_length: if set, EOS is not allowed before this many tokens.
        keep_width: return all max_length columns (a static shape, for XLA) rather than the
            steps taken (a shape that depends on values: TensorFlow only).
        prefix: (N, P) int32 target tokens every output starts with (0-padded; a row of
            zeros is no prefix). Their log-probabilities count in the score. `limits` must
            leave room for them (`prefix_limits`).
        pick: (log_probs (N, V) float32, index) -> (N,) int32, the token chosen where no
            prefix forces one (default: argmax).
        shape: the loop's shape, a `modes.LoopShape` class (beam search's too): every row to
            the end, an ended one masked, or `compact.CompactLoop`, which drops each row from
            the loop once it has ended (TensorFlow's graphs: shapes that follow values; no
            prefix; one row per sentence): `state` is then a pair (rows, sentences) of nests
            with N rows each (`step.model_step(shape=CompactLoop)`), both shrunk with the
            rows; a row's output is written out as it leaves. The same outputs as without.
        controls: a `repetition.Repetition` (the penalty on the logits, the n-gram ban on
            the log-probabilities, both on each row's output so far; nothing banned where
            the prefix forces the token), or None: off.
        rows_per_sentence: the rows of `state` per sentence (`pick_search`'s).

    Returns:
        (ids (N, T) int32 ending with EOS and padded with 0, log-probability (N,) float32).
    """
    batch = ops.shape(limits)[0]
    max_steps = ops.max(limits, initial=0) if max_length is None else max_length
    loop_shape = shape(batch, limits, rows_per_sentence, outputs=RESULTS,
                       per_row=("done",) + RESULTS, prefix=prefix)
    loop = loop_shape.start(dict(
        index=ops.convert_to_tensor(0, "int32"),
        tokens=ops.full((batch,), BOS_ID, "int32"),
        state=state,
        done=ops.zeros((batch,), "bool"),
        scores=ops.zeros((batch,), "float32"),
        # A fixed-size output buffer written in place (no TensorArray: TFLite builtins).
        ids=ops.zeros((batch, max_steps), "int32")))
    step = PickStep(step_fn, loop_shape, pick or (lambda log_probs, index: argmax(log_probs)),
                    prefix_forcing(prefix), min_length, controls, ops.arange(max_steps))

    def cond(loop):
        return ops.logical_and(loop["index"] < max_steps, ops.logical_not(ops.all(loop["done"])))

    final = ops.while_loop(cond, step, loop)
    found = loop_shape.results(final)
    return (found["ids"] if keep_width else found["ids"][:, :final["index"]]), found["scores"]


# The loop values greedy search returns.
RESULTS = ("ids", "scores")


class PickStep:
    """One step of greedy search (and sampling), the loop's body: the model's step, its
    log-probabilities, the token each row picks (or its prefix forces, or its limit), its
    score; the loop's shape (`modes.LoopShape`) says which rows it computes and what follows.

    Args:
        step_fn: as for `greedy_search`.
        shape: the loop's `modes.LoopShape`.
        pick: (log_probs (N, V), index) -> (N,) int32.
        forced_token: `rules.prefix_forcing(prefix)` (None: no prefix).
        min_length, controls: as for `greedy_search`.
        positions: (T,) int32, the output buffer's positions.
    """

    def __init__(self, step_fn, shape, pick, forced_token, min_length, controls, positions):
        self.step_fn, self.shape, self.pick, self.forced_token = step_fn, shape, pick, forced_token
        self.min_length, self.controls, self.positions = min_length, controls, positions

    def __call__(self, loop):
        index, shape = loop["index"], self.shape
        limits = shape.limits_of(loop)
        logits, state = self.step_fn(ops.expand_dims(loop["tokens"], 1), loop["state"], index)
        forced = self.forced_token and self.forced_token(index)
        log_probs = _log_probs(logits, index, self.min_length, self.controls, loop["ids"],
                               forced)
        next_tokens = self.pick(log_probs, index)
        if forced is not None:
            next_tokens = ops.where(forced[0], forced[1], next_tokens)
        next_tokens = ops.where(index + 1 >= limits, EOS_ID, next_tokens)
        next_tokens = shape.unless_done(loop, next_tokens, PAD_ID)
        chosen = ops.take_along_axis(log_probs, ops.expand_dims(next_tokens, 1), axis=1)[:, 0]
        new = dict(index=index + 1, scores=loop["scores"] + shape.unless_done(loop, chosen, 0.0),
                   ids=ops.where(ops.equal(self.positions, index)[None, :], next_tokens[:, None],
                                 loop["ids"]),
                   done=shape.done_after(loop, ops.equal(next_tokens, EOS_ID)))
        return shape.stay(loop, new, state, next_tokens)


def _log_probs(logits, index, min_length, controls, outputs, forced=None):
    """A step's (N, V) log-probabilities from its logits (N, 1, V): the repetition controls
    on each row's `outputs` so far (if any; `forced`: the prefix's (forced, token) rows,
    which nothing bans), the special tokens banned."""
    logits = ops.cast(logits[:, -1], "float32")
    if controls is not None:
        logits = controls.logits(logits, lambda: (outputs, index))
    log_probs = ops.log_softmax(logits, axis=-1)
    if controls is not None:
        log_probs = controls.log_probs(log_probs, lambda: (outputs, index),
                                       None if forced is None else lambda: forced[0][:, None])
    return mask_special_tokens(log_probs, index, min_length)


def compiled_greedy_search(model, cached=True, extra_length=EXTRA_LENGTH, jit_compile=False,
                           with_prefix=False, no_repeat_ngram_size=NGRAM_OFF,
                           repetition_penalty=PENALTY_OFF):
    """`translate_greedy` compiled once (see `compile_search` for each backend).

    With jit_compile (always under JAX), the search loop is compiled by XLA once per input
    shape (pad inputs to a few widths to bound the compilations).

    Returns a function: source_ids (B, S) int32 [, prefix (B, P) int32 with with_prefix]
    -> (ids (B, T), log-probabilities (B,)).
    """

    def search(source_ids, static, prefix=None):
        result = translate_greedy(model, source_ids, prefix=prefix, static=static,
                                  cached=cached, extra_length=extra_length,
                                  no_repeat_ngram_size=no_repeat_ngram_size,
                                  repetition_penalty=repetition_penalty)
        return result["ids"][:, 0], result["scores"][:, 0]

    extra = (((None, None), "int32"),) if with_prefix else ()
    return compile_search(model, search, lambda outputs: (trim(outputs[0]), outputs[1]),
                          jit_compile, extra)


def translate_greedy(model, source_ids, *, prefix=None, empty_rows=None, static=False,
                     cached=True, extra_length=EXTRA_LENGTH, max_output_length=None,
                     min_length=None, shape=None, no_repeat_ngram_size=NGRAM_OFF,
                     repetition_penalty=PENALTY_OFF):
    """Greedy search of `model`: the one body of this mode (see the module docstring).

    Args:
        model: a `Transformer` or an `Ensemble`.
        source_ids: (B, S) int32, EOS-terminated, 0-padded.
        prefix: (B, P) int32 target tokens each output starts with (0-padded; a row of zeros
            is no prefix); their log-probabilities count in the score.
        empty_rows: (B,) bool, rows whose output is EOS alone with score 0 whatever the
            search finds (the exports' rule for empty inputs, `eos_for_empty_rows`).
        static: keep every shape static (XLA, JAX): buffers of `static_max_length` (+ P)
            positions, the ids not trimmed (`trim` them outside the compiled function).
        cached, extra_length, max_output_length, min_length: as for `pick_search`.
        shape: the loop's shape (`greedy_search`); default: the compact loop where it can,
            a cached search without prefix where shapes may follow values (TensorFlow's
            graphs without XLA; `compact.default_shape`).
        no_repeat_ngram_size, repetition_penalty: the repetition controls
            (`search.repetition`; off by default), Python numbers or scalar tensors.

    Returns:
        {"ids": (B, 1, T) int32 ending with EOS, 0-padded, "scores": (B, 1) log P(Y | X)};
        T is the steps taken unless static.
    """
    ids, scores = pick_search(model, source_ids, 1, prefix=prefix, static=static,
                              cached=cached, extra_length=extra_length,
                              max_output_length=max_output_length, min_length=min_length,
                              shape=shape or default_shape(static, cached, prefix),
                              controls=repetition(no_repeat_ngram_size, repetition_penalty))
    # The loop keeps the steps taken: only the empty-row rule may leave columns to trim.
    return finish({"ids": ids, "scores": scores}, empty_rows,
                  trim_ids=not static and empty_rows is not None)


def pick_search(model, source_ids, rows_per_sentence, pick=None, *, prefix=None, static=False,
                cached=True, extra_length=EXTRA_LENGTH, max_output_length=None,
                min_length=None, shape=LoopShape, controls=None):
    """`greedy_search` on `model` with `rows_per_sentence` rows per sentence, each picking
    its tokens by `pick` (default: the most likely; `sampling.translate_sample` draws them).

    Args:
        rows_per_sentence: a Python int, or a scalar tensor on TensorFlow.
        prefix, static: as for `translate_greedy` (the prefix is one row per sentence).
        cached: False recomputes the whole decoder at every step (a reference for tests).
        extra_length: maximum output length = source length + extra_length (paper: 50).
        max_output_length: a Python int instead: every output at most this many tokens (EOS
            included), also the static length of the buffers.
        min_length: if set, EOS is not allowed before this many tokens.
        shape: the loop's shape (`greedy_search`; the compact loop takes one row per
            sentence, no prefix, where shapes may follow values).
        controls: the repetition controls (`greedy_search`), or None.

    Returns:
        (ids (B, R, T) int32, log-probabilities (B, R) float32), R = rows_per_sentence.
    """
    step_fn, state, limits, max_length = prefixed_step(
        model, source_ids, rows_per_sentence, static, prefix, cached=cached,
        extra_length=extra_length, max_output_length=max_output_length, shape=shape)
    single = isinstance(rows_per_sentence, int) and rows_per_sentence == 1
    rows_prefix = None if prefix is None or single else tile_beams(prefix, rows_per_sentence)
    ids, scores = greedy_search(
        step_fn, state, limits if single else tile_beams(limits, rows_per_sentence),
        max_length, min_length, keep_width=static, prefix=prefix if single else rows_prefix,
        pick=pick, shape=shape, controls=controls, rows_per_sentence=rows_per_sentence)
    if single:
        return ops.expand_dims(ids, 1), ops.expand_dims(scores, 1)
    batch = ops.shape(source_ids)[0]
    return (ops.reshape(ids, (batch, rows_per_sentence, ops.shape(ids)[1])),
            ops.reshape(scores, (batch, rows_per_sentence)))

