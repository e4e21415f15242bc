"""Greedy search over the model's cached `decode_step` API (beam search: `beam_search.py`).

Search is separate from the model: it only calls `model.encode`, `model.init_cache` and
`model.decode_step(tokens, cache, index) -> (logits, cache)`.
"""

import tensorflow as tf

from pipelines.special_ids import BOS_ID, EOS_ID, PAD_ID

EXTRA_LENGTH = 50  # paper: maximum output length = input length + 50


def output_limits(source_ids, extra_length=EXTRA_LENGTH):
    """Per-sentence maximum output length (EOS included): real source length + extra_length."""
    source_lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, PAD_ID), tf.int32), axis=1)
    return source_lengths + extra_length


def greedy_search(model, source_ids, extra_length=EXTRA_LENGTH):
    """Picks the most likely token at every step, with the incremental cache.

    Args:
        model: a `Transformer`.
        source_ids: int32 (B, S), padded with 0, each row ending with EOS.
        extra_length: outputs stop at source length + extra_length tokens (EOS forced there).

    Returns:
        (ids (B, T) int32 ending with EOS and padded with 0, log-probability (B,) float32).
    """
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    batch = tf.shape(source_ids)[0]
    limits = output_limits(source_ids, extra_length)
    max_steps = tf.reduce_max(limits) if tf.size(limits) > 0 else tf.constant(0)
    encoder_output, source_mask = model.encode(source_ids)
    cache = model.init_cache(encoder_output, source_mask, max_steps)

    def body(index, tokens, cache, finished, scores, outputs):
        logits, cache = model.decode_step(tokens[:, None], cache, index)
        log_probs = tf.nn.log_softmax(logits[:, 0], axis=-1)
        next_tokens = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
        next_tokens = tf.where(index + 1 >= limits, EOS_ID, next_tokens)
        next_tokens = tf.where(finished, PAD_ID, next_tokens)
        chosen = tf.gather(log_probs, next_tokens, batch_dims=1)
        scores += tf.where(finished, 0.0, chosen)
        outputs = outputs.write(index, next_tokens)
        finished = tf.logical_or(finished, tf.equal(next_tokens, EOS_ID))
        return index + 1, next_tokens, cache, finished, scores, outputs

    def cond(index, tokens, cache, finished, scores, outputs):
        return tf.logical_and(index < max_steps, tf.logical_not(tf.reduce_all(finished)))

    state = (
        tf.constant(0),
        tf.fill([batch], BOS_ID),
        cache,
        tf.zeros([batch], tf.bool),
        tf.zeros([batch], tf.float32),
        tf.TensorArray(tf.int32, size=0, dynamic_size=True, element_shape=[None]),
    )
    _, _, _, _, scores, outputs = tf.while_loop(cond, body, state)
    ids = tf.transpose(outputs.stack())  # (B, T)
    ids = tf.reshape(ids, [batch, -1])
    return ids, scores


def compiled_greedy_search(model, extra_length=EXTRA_LENGTH):
    """greedy_search as one tf.function for any batch shape (traced once)."""

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
    def search(source_ids):
        return greedy_search(model, source_ids, extra_length)

    return search
