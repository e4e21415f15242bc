"""Greedy search, and the bridge from a `Transformer` to the search functions.

Search is separate from the model. `greedy_search` and `beam_search` (in `beam_search.py`) take
a step function

    step_fn(tokens (N, 1), state, index) -> (logits (N, 1, V), state)

and a `state` (nested tensors with N = batch x beam rows) that beam search reorders as beams
are chosen. `model_step(model, source_ids, beam_size)` builds that function from the model's
`encode` / `init_cache` / `decode_step`: the self-attention caches are the reordered state, while
the encoder-decoder keys/values are computed once per sentence, live in the step function's
closure and are never reordered.
"""

import tensorflow as tf

from keras_transformer.defaults import TRANSLATION
from pipelines.special_ids import BOS_ID, EOS_ID, PAD_ID

EXTRA_LENGTH = TRANSLATION.extra_length  # paper: maximum output length = input length + 50
# XLA compiles a search once per input shape: inputs are padded to a multiple of this many
# tokens, so that a few widths (and compilations) serve every sentence.
XLA_WIDTH_STEP = 16


def output_limits(source_ids, extra_length=EXTRA_LENGTH):
    """Per-sentence maximum output length (EOS included): real source length + extra_length."""
    source_lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, PAD_ID), tf.int32), axis=1)
    return source_lengths + extra_length


def tile_beams(tensor, beam_size):
    """(B, ...) -> (B * beam_size, ...), each row repeated beam_size times."""
    return tf.repeat(tensor, beam_size, axis=0)


def model_step(model, source_ids, beam_size=1, max_length=None, cached=True, limits=None,
               extra_length=EXTRA_LENGTH):
    """Step function, initial state and limits for searching `model` on `source_ids`.

    Args:
        model: a `Transformer`.
        source_ids: (B, S) int32, padded with 0.
        beam_size: rows per sentence (the encoder runs once per sentence, then its keys and
            values are tiled to the beams once).
        max_length: cache length; default max(limits).
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
        max_length = tf.reduce_max(tf.concat([limits, [1]], axis=0))
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

    rows = tf.shape(encoder_output)[0]
    prefix = tf.zeros([rows, max_length], tf.int32)

    def uncached_step(tokens, prefix, index):
        prefix = tf.tensor_scatter_nd_update(
            tf.transpose(prefix), [[index]], tf.transpose(tokens))
        prefix = tf.transpose(prefix)
        logits = model.decode(prefix[:, : index + 1], encoder_output, source_mask)
        return logits[:, index:index + 1], prefix

    return uncached_step, prefix, limits, max_length


def mask_special_tokens(log_probs, index, min_length=None):
    """PAD and BOS are never generated; EOS not before position min_length - 1 if given."""
    ids = tf.range(tf.shape(log_probs)[-1])
    banned = tf.logical_or(tf.equal(ids, PAD_ID), tf.equal(ids, BOS_ID))
    if min_length is not None:
        banned = tf.logical_or(banned, tf.logical_and(tf.equal(ids, EOS_ID),
                                                      index + 1 < min_length))
    return tf.where(banned, -1e9, log_probs)


def greedy_search(step_fn, state, limits, max_length=None, min_length=None, keep_width=False):
    """Picks the most likely token at every step.

    Args:
        step_fn, state: as described in the module docstring (N = batch rows).
        limits: (B,) maximum output lengths; EOS is forced at the last allowed position.
        max_length: number of steps at most (default max(limits)).
        min_length: if set, EOS is not allowed before this many tokens.
        keep_width: return all max_length columns (a static shape, for XLA) rather than the
            steps taken.

    Returns:
        (ids (B, T) int32 ending with EOS and padded with 0, log-probability (B,) float32).
    """
    batch = tf.shape(limits)[0]
    max_steps = tf.reduce_max(tf.concat([limits, [0]], 0)) if max_length is None else max_length
    positions = tf.range(max_steps)

    def body(index, tokens, state, finished, scores, outputs):
        logits, state = step_fn(tokens[:, None], state, index)
        log_probs = tf.nn.log_softmax(tf.cast(logits[:, -1], tf.float32), axis=-1)
        log_probs = mask_special_tokens(log_probs, index, min_length)
        next_tokens = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
        next_tokens = tf.where(index + 1 >= limits, EOS_ID, next_tokens)
        next_tokens = tf.where(finished, PAD_ID, next_tokens)
        chosen = tf.gather(log_probs, next_tokens, batch_dims=1)
        scores += tf.where(finished, 0.0, chosen)
        # A fixed-size output buffer written in place (no TensorArray: TFLite builtins).
        outputs = tf.where(tf.equal(positions, index)[None, :], next_tokens[:, None], outputs)
        finished = tf.logical_or(finished, tf.equal(next_tokens, EOS_ID))
        return index + 1, next_tokens, state, finished, scores, outputs

    def cond(index, tokens, state, finished, scores, outputs):
        return tf.logical_and(index < max_steps, tf.logical_not(tf.reduce_all(finished)))

    initial = (
        tf.constant(0),
        tf.fill([batch], BOS_ID),
        state,
        tf.zeros([batch], tf.bool),
        tf.zeros([batch], tf.float32),
        tf.zeros([batch, max_steps], tf.int32),
    )
    index, _, _, _, scores, outputs = tf.while_loop(cond, body, initial)
    return (outputs if keep_width else outputs[:, :index]), scores


def trim(ids):
    """Drops the all-padding columns at the end of (..., T) ids."""
    used = tf.reduce_any(tf.not_equal(tf.reshape(ids, [-1, tf.shape(ids)[-1]]), 0), axis=0)
    length = tf.reduce_max(tf.concat([tf.where(used)[:, 0] + 1, [0]], 0))
    return ids[..., :length]


def static_max_length(source_ids, extra_length):
    """The output length bound XLA can compile: padded source width + extra_length.

    XLA needs every shape inside the search (caches, output buffers) known when it compiles,
    which it does once per input shape; the per-sentence limits stay exact (they are values).
    """
    return tf.shape(source_ids)[1] + extra_length


def xla_search_function(search, trim_outputs):
    """Wraps `search(source_ids) -> outputs` in an XLA-compiled function (compiled once per
    input shape) called from a plain tf.function that applies `trim_outputs` (shapes that
    depend on values, such as trimming padding columns, stay outside XLA)."""
    compiled = tf.function(search, jit_compile=True)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
    def run(source_ids):
        return trim_outputs(compiled(source_ids))

    return run


def compiled_greedy_search(model, cached=True, extra_length=EXTRA_LENGTH, jit_compile=False):
    """Greedy search of `model` as one tf.function for any batch shape (traced once).

    With jit_compile, the search loop is compiled by XLA once per input shape (pad inputs to a
    few widths to bound the compilations).

    Returns a function: source_ids (B, S) int32 -> (ids (B, T), log-probabilities (B,)).
    """

    def search(source_ids):
        max_length = static_max_length(source_ids, extra_length) if jit_compile else None
        step_fn, state, limits, max_length = model_step(model, source_ids, max_length=max_length,
                                                        cached=cached, extra_length=extra_length)
        # XLA: the whole output buffer; the used columns are cut outside XLA.
        return greedy_search(step_fn, state, limits, max_length, keep_width=jit_compile)

    if jit_compile:
        return xla_search_function(search, lambda outputs: (trim(outputs[0]), outputs[1]))
    return tf.function(search, input_signature=[tf.TensorSpec([None, None], tf.int32)])
