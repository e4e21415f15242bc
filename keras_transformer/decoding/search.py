"""Greedy search, the bridge from a `Transformer` to the search loops, and the one search body
per mode's shared parts.

Search is separate from the model. The loops, `greedy_search` here and `beam_search` (in
`beam_search.py`), take a step function

    step_fn(tokens (N, 1), state, index) -> (logits (N, 1, V), state)

and a `state` (nested tensors with N = batch x beam rows) that beam search reorders as beams
are chosen. `model_step(model, source_ids, beam_size)` builds that function from the model's
`encode` / `init_cache` / `decode_step`: the self-attention caches are the reordered state, while
the encoder-decoder keys/values are computed once per sentence, live in the step function's
closure and are never reordered.

Each mode has one body that builds the step and runs its loop on a model, with the prefix, the
n-best and the empty-row rules inside: `translate_greedy` (here), `beam_search.translate_beam`,
`sampling.translate_sample` and `scoring.score_ids`. Every caller runs these: `Translator`
through the `compiled_*` functions, the SavedModel signatures (`export.graph`) and the TFLite
graph (`export.tflite`); they differ only in what is specific to them (compilation, checks of a
request, tokenization). The bodies return the n-best layout, `{"ids": (B, H, T), "scores":
(B, H), ...}`, and take their options as Python values or scalar tensors (a signature's
inputs).

The searches are written once in `keras.ops` and run on every backend:

* TensorFlow: one `tf.function` for any batch shape, with shapes that follow the values (the
  cache and output buffer hold max(limits) positions, the output keeps the steps taken), or,
  with `jit_compile`, the loop compiled by XLA once per input shape. The exports build their
  graphs from the same bodies.
* JAX: `jax.jit`, compiled once per input shape. Every shape inside the loop is static there
  (a body's `static=True`): the cache and output buffer hold `static_max_length` positions
  (padded source width + extra_length) while each sentence's limit stays exact (a value); the
  all-padding columns are cut afterwards, outside the compiled function (`trim`).
"""

import keras
import numpy as np
from keras import ops

from keras_transformer.decoding.compiling import compile_search
from keras_transformer.defaults import TRANSLATION
from pipelines.special_ids import BOS_ID, EOS_ID, PAD_ID

EXTRA_LENGTH = TRANSLATION.extra_length  # paper: maximum output length = input length + 50
# XLA compiles a search once per input shape: inputs are padded to a multiple of this many
# tokens, so that a few widths (and compilations) serve every sentence.
XLA_WIDTH_STEP = 16
NEG_INF = -1e9  # the log-probability of what may not be chosen


def dynamic_shapes():
    """Whether shapes inside a search may depend on values (TensorFlow's graphs); other
    backends compile every shape statically."""
    return keras.backend.backend() == "tensorflow"


def output_limits(source_ids, extra_length=EXTRA_LENGTH):
    """Per-sentence maximum output length (EOS included): real source length + extra_length."""
    source_lengths = ops.sum(ops.cast(ops.not_equal(source_ids, PAD_ID), "int32"), axis=1)
    return source_lengths + extra_length


def static_max_length(source_ids, extra_length=EXTRA_LENGTH):
    """The output length bound a compiler can fix: padded source width + extra_length.

    XLA (TensorFlow's jit_compile, JAX) needs every shape inside the search (caches, output
    buffers) known when it compiles, which it does once per input shape; the per-sentence
    limits stay exact (they are values).
    """
    return ops.shape(source_ids)[1] + extra_length


def tile_beams(tensor, beam_size):
    """(B, ...) -> (B * beam_size, ...), each row repeated beam_size times."""
    return ops.repeat(tensor, beam_size, axis=0)


def model_step(model, source_ids, beam_size=1, max_length=None, cached=True, limits=None,
               extra_length=EXTRA_LENGTH):
    """Step function, initial state and limits for searching `model` on `source_ids`.

    Args:
        model: a `Transformer`, or an `Ensemble` of them (its state is the tuple of the
            members' states; each step gives the log of their mean probabilities).
        source_ids: (B, S) int32, padded with 0.
        beam_size: rows per sentence (the encoder runs once per sentence, then its keys and
            values are tiled to the beams once).
        max_length: cache length; default max(limits) on TensorFlow, `static_max_length` on
            backends that compile static shapes (pass it with your own `limits` there).
        cached: False recomputes the whole decoder over the prefix at every step (slow; a
            reference to test the cache against).
        limits: (B,) maximum output lengths (default: source length + extra_length).
        extra_length: 50 in the paper's translation setting, 300 for parsing.

    Returns:
        (step_fn, state, limits (B,), max_length).
    """
    if limits is None:
        limits = output_limits(source_ids, extra_length)
    if max_length is None:
        max_length = (ops.max(limits, initial=1) if dynamic_shapes()
                      else static_max_length(source_ids, extra_length))
    members = getattr(model, "members", None)  # an `Ensemble`
    if members is not None:
        return _ensemble_step(members, source_ids, beam_size, max_length, cached, limits)
    encoder_output, source_mask = model.encode(source_ids)
    encoder_output = tile_beams(encoder_output, beam_size)
    source_mask = tile_beams(source_mask, beam_size)
    if cached:
        cache = model.init_cache(encoder_output, source_mask, max_length)
        cross = cache["cross"]

        def step_fn(tokens, state, index):
            logits, cache = model.decode_step(
                tokens, {"self": state, "cross": cross, "source_mask": source_mask}, index)
            return logits, cache["self"]

        return step_fn, cache["self"], limits, max_length

    rows = ops.shape(encoder_output)[0]
    prefix = ops.zeros((rows, max_length), "int32")

    def uncached_step(tokens, prefix, index):
        prefix = ops.slice_update(prefix, (0, index), ops.cast(tokens, "int32"))
        # The whole buffer (a static shape): the causal mask hides the positions after index.
        logits = model.decode(prefix, encoder_output, source_mask)
        return ops.expand_dims(ops.take(logits, index, axis=1), 1), prefix

    return uncached_step, prefix, limits, max_length


def _ensemble_step(members, source_ids, beam_size, max_length, cached, limits):
    """`model_step` for an `Ensemble`: the state is the tuple of the members' states; the
    step returns the log of the members' mean next-token probabilities (as logits: a log-softmax
    of them gives them back)."""
    from keras_transformer.models.ensemble import mean_of_probabilities

    steps = [model_step(member, source_ids, beam_size, max_length, cached, limits)[:2]
             for member in members]

    def step_fn(tokens, state, index):
        outputs = [fn(tokens, member_state, index) for (fn, _), member_state in zip(steps, state)]
        return (mean_of_probabilities([logits for logits, _ in outputs]),
                tuple(member_state for _, member_state in outputs))

    return step_fn, tuple(initial for _, initial in steps), limits, max_length


def mask_special_tokens(log_probs, index, min_length=None):
    """PAD and BOS are never generated; EOS not before position min_length - 1 if given."""
    ids = ops.arange(ops.shape(log_probs)[-1])
    banned = ops.logical_or(ops.equal(ids, PAD_ID), ops.equal(ids, BOS_ID))
    if min_length is not None:
        banned = ops.logical_or(banned, ops.logical_and(ops.equal(ids, EOS_ID),
                                                        index + 1 < min_length))
    return ops.where(banned, NEG_INF, log_probs)


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
                  prefix=None, pick=None):
    """Picks the next token of every row by a rule, one step at a time: the most likely one
    (greedy search) unless `pick` says otherwise (`decoding.sampling.RandomSampler` draws it).

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

    Returns:
        (ids (N, T) int32 ending with EOS and padded with 0, log-probability (N,) float32).
    """
    batch = ops.shape(limits)[0]
    max_steps = ops.max(limits, initial=0) if max_length is None else max_length
    positions = ops.arange(max_steps)
    pick = pick or (lambda log_probs, index: argmax(log_probs))
    forced_token = prefix_forcing(prefix)

    def body(index, tokens, state, finished, scores, outputs):
        logits, state = step_fn(ops.expand_dims(tokens, 1), state, index)
        log_probs = ops.log_softmax(ops.cast(logits[:, -1], "float32"), axis=-1)
        log_probs = mask_special_tokens(log_probs, index, min_length)
        next_tokens = pick(log_probs, index)
        if forced_token is not None:
            forced, token = forced_token(index)
            next_tokens = ops.where(forced, token, next_tokens)
        next_tokens = ops.where(index + 1 >= limits, EOS_ID, next_tokens)
        next_tokens = ops.where(finished, PAD_ID, next_tokens)
        chosen = ops.take_along_axis(log_probs, ops.expand_dims(next_tokens, 1), axis=1)[:, 0]
        scores += ops.where(finished, 0.0, chosen)
        # A fixed-size output buffer written in place (no TensorArray: TFLite builtins).
        outputs = ops.where(ops.equal(positions, index)[None, :], next_tokens[:, None], outputs)
        finished = ops.logical_or(finished, ops.equal(next_tokens, EOS_ID))
        return index + 1, next_tokens, state, finished, scores, outputs

    def cond(index, tokens, state, finished, scores, outputs):
        return ops.logical_and(index < max_steps, ops.logical_not(ops.all(finished)))

    initial = (
        ops.convert_to_tensor(0, "int32"),
        ops.full((batch,), BOS_ID, "int32"),
        state,
        ops.zeros((batch,), "bool"),
        ops.zeros((batch,), "float32"),
        ops.zeros((batch, max_steps), "int32"),
    )
    index, _, _, _, scores, outputs = ops.while_loop(cond, body, initial)
    return (outputs if keep_width else outputs[:, :index]), scores


def prefix_lengths(prefix):
    """(N, P) 0-padded prefix ids -> (N,) int32 numbers of tokens."""
    return ops.sum(ops.cast(ops.not_equal(prefix, PAD_ID), "int32"), axis=1)


def prefix_limits(limits, prefix):
    """Output limits that leave room for the prefix and EOS after it: max(limit, P_i + 1)."""
    return limits if prefix is None else ops.maximum(limits, prefix_lengths(prefix) + 1)


def prefix_forcing(prefix):
    """None without a prefix; else index -> (forced (N,) bool, token (N,) int32): whether
    row i's token at step index is its prefix's, and which."""
    if prefix is None:
        return None
    # A column of padding at the end: a prefix of width 0 (every row empty) still has a
    # column to read, and past a row's prefix the read is padding.
    prefix = ops.cast(prefix, "int32")
    prefix = ops.concatenate([prefix, ops.zeros((ops.shape(prefix)[0], 1), "int32")], axis=1)
    lengths = prefix_lengths(prefix)
    width = ops.shape(prefix)[1]

    def forced_token(index):
        column = ops.minimum(index, width - 1)
        token = ops.take(prefix, ops.expand_dims(column, 0), axis=1)[:, 0]
        return index < lengths, token

    return forced_token


def trim(ids):
    """Drops the all-padding columns at the end of (..., T) ids.

    The result's shape depends on the values: call it in a TensorFlow graph or on numpy
    arrays (the host side of a JAX search), never inside a compiled JAX function.
    """
    leading = tuple(range(len(ids.shape) - 1))
    if isinstance(ids, np.ndarray):
        used = np.flatnonzero(np.any(ids != PAD_ID, axis=leading))
        return ids[..., : (used[-1] + 1 if used.size else 0)]
    used = ops.any(ops.not_equal(ids, PAD_ID), axis=leading)  # (T,)
    length = ops.max(ops.where(used, ops.arange(1, ops.shape(ids)[-1] + 1), 0), initial=0)
    return ids[..., :length]


def compiled_greedy_search(model, cached=True, extra_length=EXTRA_LENGTH, jit_compile=False,
                           with_prefix=False):
    """`translate_greedy` compiled once (see `compile_search` for each backend).

    With jit_compile (always under JAX), the search loop is compiled by XLA once per input
    shape (pad inputs to a few widths to bound the compilations).

    Returns a function: source_ids (B, S) int32 [, prefix (B, P) int32 with with_prefix]
    -> (ids (B, T), log-probabilities (B,)).
    """

    def search(source_ids, static, prefix=None):
        result = translate_greedy(model, source_ids, prefix=prefix, static=static,
                                  cached=cached, extra_length=extra_length)
        return result["ids"][:, 0], result["scores"][:, 0]

    extra = (((None, None), "int32"),) if with_prefix else ()
    return compile_search(model, search, lambda outputs: (trim(outputs[0]), outputs[1]),
                          jit_compile, extra)


def translate_greedy(model, source_ids, *, prefix=None, empty_rows=None, static=False,
                     cached=True, extra_length=EXTRA_LENGTH, max_output_length=None,
                     min_length=None):
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

    Returns:
        {"ids": (B, 1, T) int32 ending with EOS, 0-padded, "scores": (B, 1) log P(Y | X)};
        T is the steps taken unless static.
    """
    ids, scores = pick_search(model, source_ids, 1, prefix=prefix, static=static,
                              cached=cached, extra_length=extra_length,
                              max_output_length=max_output_length, min_length=min_length)
    # The loop keeps the steps taken: only the empty-row rule may leave columns to trim.
    return finish({"ids": ids, "scores": scores}, empty_rows,
                  trim_ids=not static and empty_rows is not None)


def pick_search(model, source_ids, rows_per_sentence, pick=None, *, prefix=None, static=False,
                cached=True, extra_length=EXTRA_LENGTH, max_output_length=None,
                min_length=None):
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

    Returns:
        (ids (B, R, T) int32, log-probabilities (B, R) float32), R = rows_per_sentence.
    """
    step_fn, state, limits, max_length = prefixed_step(
        model, source_ids, rows_per_sentence, static, prefix, cached=cached,
        extra_length=extra_length, max_output_length=max_output_length)
    single = isinstance(rows_per_sentence, int) and rows_per_sentence == 1
    rows_prefix = None if prefix is None or single else tile_beams(prefix, rows_per_sentence)
    ids, scores = greedy_search(
        step_fn, state, limits if single else tile_beams(limits, rows_per_sentence),
        max_length, min_length, keep_width=static, prefix=prefix if single else rows_prefix,
        pick=pick)
    if single:
        return ops.expand_dims(ids, 1), ops.expand_dims(scores, 1)
    batch = ops.shape(source_ids)[0]
    return (ops.reshape(ids, (batch, rows_per_sentence, ops.shape(ids)[1])),
            ops.reshape(scores, (batch, rows_per_sentence)))


def prefixed_step(model, source_ids, rows_per_sentence, static, prefix=None, cached=True,
                  extra_length=EXTRA_LENGTH, max_output_length=None):
    """`model_step` for a search of `rows_per_sentence` rows per sentence (beams or samples)
    whose outputs may start with a prefix ((B, P) ids): the limits leave room for the prefix
    and EOS after it, and with `static` (or a Python int `max_output_length`: every output's
    limit) the buffers hold a static bound, P more positions with a prefix."""
    if max_output_length is None:
        limits = output_limits(source_ids, extra_length)
        bound = static_max_length(source_ids, extra_length) if static else None
    else:
        limits = ops.full((ops.shape(source_ids)[0],), max_output_length, "int32")
        bound = max_output_length
    limits = prefix_limits(limits, prefix)
    if bound is not None and prefix is not None:
        bound += ops.shape(prefix)[1]
    return model_step(model, source_ids, rows_per_sentence, bound, cached=cached,
                      limits=limits, extra_length=extra_length)


def with_optional_prefix(search, prefix, static):
    """`search(prefix)`, or, when no row of the prefix holds a token, `search(None)`: the search
    without the per-step prefix masking (a request without prefixes, in a TensorFlow graph; a
    static search always runs the masked one, which finds the same)."""
    if prefix is None or static:
        return search(prefix)
    return ops.cond(ops.any(ops.not_equal(prefix, PAD_ID)), lambda: search(prefix),
                    lambda: search(None))


def finish(result, empty_rows=None, trim_ids=True):
    """A body's result as its callers get it: the empty-row rule applied (`eos_for_empty_rows`)
    and the ids trimmed of their padding columns (never inside a static search: its callers
    trim outside the compiled function)."""
    if empty_rows is not None:
        result = eos_for_empty_rows(result, empty_rows)
    if trim_ids:
        result = {**result, "ids": trim(result["ids"])}
    return result


def eos_for_empty_rows(result, empty_rows):
    """The exports' rule for empty inputs on a result in the n-best layout: an empty row's
    first hypothesis is EOS alone with score 0, its others hold no tokens with score NEG_INF
    (every other score of the result, e.g. "log_probs", follows "scores"). The ids keep at
    least one column, so that every row can end with EOS."""
    ids = result["ids"]
    shape = ops.shape(ids)
    width = shape[2]
    if not isinstance(width, int):  # a value (TensorFlow graph): at least one column
        ids = ops.pad(ids, [[0, 0], [0, 0], [0, ops.maximum(0, 1 - width)]])
        width = ops.maximum(width, 1)
    elif width < 1:
        ids = ops.pad(ids, [[0, 0], [0, 0], [0, 1 - width]])
        width = 1
    first = ops.equal(ops.arange(shape[1]), 0)[None, :]  # (1, H)
    eos_only = ops.equal(ops.arange(width), 0)[None, None, :]
    replaced = ops.where(ops.logical_and(first[:, :, None], eos_only), EOS_ID, PAD_ID)
    empty = empty_rows[:, None]
    finished = {key: ops.where(empty, ops.where(first, 0.0, NEG_INF), scores)
                for key, scores in result.items() if key != "ids"}
    return {**finished, "ids": ops.where(empty[:, :, None], replaced, ids)}
