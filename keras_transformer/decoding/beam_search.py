"""Beam search as in the paper (Section 6.1): beam 4, length penalty alpha 0.6, maximum output
length = input length + 50, early termination.

Length penalty from GNMT (Wu et al., 2016, "Google's Neural Machine Translation System"):

    score(Y) = log P(Y | X) / lp(Y),    lp(Y) = ((5 + |Y|) / 6) ** alpha

with |Y| counting the output tokens including EOS.

The search keeps, per sentence, `beam_size` alive hypotheses and a pool of `beam_size` finished
ones. Each step expands the alive beams, takes the 2 x beam_size best continuations (so that
beam_size of them are not EOS), moves the EOS ones into the finished pool (kept sorted by
score) and the others into the alive beams, and reorders the decoder state (the self-attention
caches) to follow their parents. A sentence is done when its best alive hypothesis, even given
the largest length penalty it could still reach, cannot beat the lowest finished score in its
pool, or when it reaches its maximum length (EOS is forced there). The loop ends when every
sentence is done.
"""

import tensorflow as tf

from keras_transformer.decoding.search import (  # noqa: F401  (trim: re-exported)
    EXTRA_LENGTH, mask_special_tokens, model_step, static_max_length, trim,
    xla_search_function)
from keras_transformer.defaults import TRANSLATION
from pipelines.special_ids import BOS_ID, EOS_ID

NEG_INF = -1e9


def length_penalty(length, alpha):
    """GNMT length penalty ((5 + length) / 6) ** alpha."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def beam_search(step_fn, state, limits, beam_size=TRANSLATION.beam_size, alpha=TRANSLATION.alpha,
                max_length=None, min_length=None):
    """Batched beam search over a step function.

    Args:
        step_fn: (tokens (B*K, 1), state, index) -> (logits (B*K, 1, V), state).
        state: nested tensors with B*K rows (row b*K + k: sentence b, beam k), reordered along
            their first axis as beams are chosen.
        limits: (B,) int32 maximum output lengths (EOS included).
        beam_size: K (int or scalar tensor).
        alpha: length-penalty exponent (scalar, may be a tensor).
        max_length: steps at most (default max(limits)).
        min_length: if set, EOS is not allowed before this many tokens.

    Returns:
        dict with
          "ids": (B, K, T) int32 hypotheses, best first, each ending with EOS, padded with 0;
          "scores": (B, K) length-normalized scores (NEG_INF where the pool was not filled);
          "log_probs": (B, K) log P(Y | X).
    """
    batch = tf.shape(limits)[0]
    static = tf.get_static_value(beam_size)
    # A Python int keeps the beam dimension static through the loop.
    k = int(static) if static is not None else tf.convert_to_tensor(beam_size, tf.int32)
    alpha = tf.cast(alpha, tf.float32)
    steps = tf.reduce_max(tf.concat([limits, [1]], 0)) if max_length is None else max_length
    zeros_seq = tf.zeros([batch, k, steps], tf.int32)
    first_beam_only = tf.concat([[0.0], tf.fill([k - 1], NEG_INF)], axis=0)
    initial = dict(
        index=tf.constant(0),
        tokens=tf.fill([batch * k], BOS_ID),
        state=state,
        alive_seq=zeros_seq,
        alive_log_probs=tf.tile(first_beam_only[None], [batch, 1]),
        finished_seq=zeros_seq,
        finished_scores=tf.fill([batch, k], NEG_INF),
        finished_log_probs=tf.fill([batch, k], NEG_INF),
        done=tf.zeros([batch], tf.bool),
    )
    best_penalty = length_penalty(limits, alpha)  # the largest penalty a hypothesis can reach

    def body(s):
        index = s["index"]
        logits, state = step_fn(s["tokens"][:, None], s["state"], index)
        log_probs = tf.nn.log_softmax(tf.cast(logits[:, -1], tf.float32), axis=-1)
        log_probs = mask_special_tokens(log_probs, index, min_length)
        vocab = tf.shape(log_probs)[-1]
        log_probs = tf.reshape(log_probs, [batch, k, vocab])
        # At the last allowed position only EOS may follow.
        at_limit = (index + 1 >= limits)[:, None, None]
        is_eos_column = tf.equal(tf.range(vocab), EOS_ID)[None, None, :]
        log_probs = tf.where(tf.logical_and(at_limit, tf.logical_not(is_eos_column)),
                             NEG_INF, log_probs)

        # Expand: 2K best (beam, token) continuations per sentence.
        scores = s["alive_log_probs"][:, :, None] + log_probs  # (B, K, V)
        top_scores, top_ids = tf.math.top_k(tf.reshape(scores, [batch, k * vocab]), k=2 * k)
        parents, tokens = top_ids // vocab, top_ids % vocab  # (B, 2K)
        write_here = tf.equal(tf.range(steps), index)[None, None, :]
        candidates = tf.where(write_here, tokens[:, :, None],
                              tf.gather(s["alive_seq"], parents, batch_dims=1))  # (B, 2K, T)
        is_eos = tf.equal(tokens, EOS_ID)
        real = tf.logical_and(top_scores > NEG_INF / 2, tf.logical_not(s["done"])[:, None])

        # Finished pool: keep the K best of (pool + new EOS hypotheses).
        new_scores = tf.where(tf.logical_and(is_eos, real),
                              top_scores / length_penalty(index + 1, alpha), NEG_INF)
        pool_scores = tf.concat([s["finished_scores"], new_scores], axis=1)
        finished_scores, keep = tf.math.top_k(pool_scores, k=k)
        finished_seq = tf.gather(tf.concat([s["finished_seq"], candidates], 1), keep,
                                 batch_dims=1)
        finished_log_probs = tf.gather(tf.concat([s["finished_log_probs"], top_scores], 1), keep,
                                       batch_dims=1)

        # Alive beams: the K best non-EOS continuations; the state follows their parents.
        alive_log_probs, keep = tf.math.top_k(tf.where(is_eos, NEG_INF, top_scores), k=k)
        alive_seq = tf.gather(candidates, keep, batch_dims=1)
        rows = tf.gather(parents, keep, batch_dims=1) + tf.range(batch)[:, None] * k
        state = tf.nest.map_structure(lambda t: _reorder(t, tf.reshape(rows, [-1])), state)
        next_tokens = tf.reshape(tf.gather(tokens, keep, batch_dims=1), [-1])

        # Early termination: nothing alive can still beat the lowest finished score.
        lowest_finished = tf.reduce_min(
            tf.where(finished_scores > NEG_INF / 2, finished_scores, -NEG_INF), axis=1)
        lowest_finished = tf.where(finished_scores[:, 0] > NEG_INF / 2, lowest_finished, NEG_INF)
        best_alive = alive_log_probs[:, 0] / best_penalty
        done = s["done"] | (lowest_finished >= best_alive) | (index + 1 >= limits)
        return dict(index=index + 1, tokens=next_tokens, state=state, alive_seq=alive_seq,
                    alive_log_probs=alive_log_probs, finished_seq=finished_seq,
                    finished_scores=finished_scores, finished_log_probs=finished_log_probs,
                    done=done)

    def cond(s):
        return tf.logical_and(s["index"] < steps, tf.logical_not(tf.reduce_all(s["done"])))

    final = tf.while_loop(cond, lambda s: (body(s),), (initial,))[0]
    return {"ids": final["finished_seq"], "scores": final["finished_scores"],
            "log_probs": final["finished_log_probs"]}


def _reorder(tensor, rows):
    """tensor[rows], keeping the static shape (the row count does not change)."""
    reordered = tf.gather(tensor, rows)
    reordered.set_shape(tensor.shape)
    return reordered


def translate_beam(model, source_ids, beam_size=TRANSLATION.beam_size, alpha=TRANSLATION.alpha,
                   cached=True, extra_length=EXTRA_LENGTH):
    """Beam search of `model` on (B, S) source ids; returns the `beam_search` dict, trimmed."""
    step_fn, state, limits, max_length = model_step(model, source_ids, beam_size, cached=cached,
                                                    extra_length=extra_length)
    result = beam_search(step_fn, state, limits, beam_size, alpha, max_length)
    result["ids"] = trim(result["ids"])
    return result


def compiled_beam_search(model, beam_size=TRANSLATION.beam_size, alpha=TRANSLATION.alpha,
                         cached=True, extra_length=EXTRA_LENGTH, jit_compile=False):
    """`translate_beam` as one tf.function for any batch shape (traced once).

    With jit_compile, the search loop is compiled by XLA once per input shape (pad inputs to a
    few widths to bound the compilations): on CPU it runs the whole loop without TensorFlow's
    per-op overhead and updates the caches in place.
    """
    if not jit_compile:
        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
        def search(source_ids):
            return translate_beam(model, source_ids, beam_size, alpha, cached, extra_length)

        return search

    def xla_search(source_ids):
        step_fn, state, limits, max_length = model_step(
            model, source_ids, beam_size, static_max_length(source_ids, extra_length),
            cached=cached, extra_length=extra_length)
        return beam_search(step_fn, state, limits, beam_size, alpha, max_length)

    def trim_ids(result):
        return {**result, "ids": trim(result["ids"])}

    return xla_search_function(xla_search, trim_ids)
