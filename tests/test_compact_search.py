"""The compact searches (`beam_search(shape=CompactLoop)`, `greedy_search(shape=CompactLoop)`,
TensorFlow's graphs): a sentence leaves the loop once it is done, and the outputs are those of
the search that keeps every row."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.decoding.search.beam_search import beam_search, translate_beam
from keras_transformer.decoding.search.compact import CompactLoop
from keras_transformer.decoding.search.greedy import greedy_search, translate_greedy
from keras_transformer.decoding.search.modes import LoopShape
from pipelines.special_ids import EOS_ID
from tests.search_helpers import source_rows, tiny_model

VOCAB = 40
BEAM = 2


def ending_step(rows_seen, beam=BEAM):
    """A step whose sentence b ends (EOS near-certain) from step ends[b] on, earlier "a" (3)
    near-certain; ends[b] is read from the per-sentence state, as cross-attention is. Records
    the rows each step computes."""
    def step(tokens, state, index):
        rows, sentences = state
        rows_seen.append(int(tf.shape(tokens)[0]))
        ends = tf.repeat(sentences["ends"], beam)  # (rows,), beams of a sentence side by side
        eos = tf.one_hot(EOS_ID, 5) * 0.98 + 0.004
        word = tf.one_hot(3, 5) * 0.98 + 0.004
        probs = tf.where((index >= ends)[:, None], eos[None], word[None])
        return tf.math.log(probs)[:, None, :], (rows + 1, sentences)

    return step


def test_done_sentences_leave_the_loop_and_the_outputs_stay():
    ends = tf.constant([1, 6, 3, 9], tf.int32)
    limits = tf.constant([20, 20, 20, 20], tf.int32)
    rows_seen = []
    compact = beam_search(ending_step(rows_seen), (tf.zeros([4 * BEAM]), {"ends": ends}),
                          limits, beam_size=BEAM, alpha=0.6, shape=CompactLoop)

    def full_step(tokens, state, index):  # every row, every step
        logits, (rows, _) = ending_step([])(tokens, (state, {"ends": ends}), index)
        return logits, rows

    full = beam_search(full_step, tf.zeros([4 * BEAM]), limits, beam_size=BEAM, alpha=0.6)
    for key in ("ids", "scores", "log_probs"):
        np.testing.assert_array_equal(compact[key].numpy(), full[key].numpy(), err_msg=key)
    lengths = [list(row).index(EOS_ID) + 1 for row in compact["ids"][:, 0].numpy()]
    assert lengths == [2, 7, 4, 10]  # each sentence's own ending, in its own row
    # Rows computed per step: all 4 sentences, then fewer as each is done.
    assert rows_seen[0] == 4 * BEAM and rows_seen[-1] == BEAM
    assert rows_seen == sorted(rows_seen, reverse=True) and len(set(rows_seen)) == 4


def test_greedy_rows_leave_the_loop_as_they_end():
    ends = tf.constant([4, 1, 7], tf.int32)
    limits = tf.constant([20, 20, 20], tf.int32)
    rows_seen = []
    ids, scores = greedy_search(ending_step(rows_seen, 1), (tf.zeros([3]), {"ends": ends}),
                                limits, shape=CompactLoop)

    def full_step(tokens, state, index):
        logits, (rows, _) = ending_step([], 1)(tokens, (state, {"ends": ends}), index)
        return logits, rows

    full_ids, full_scores = greedy_search(full_step, tf.zeros([3]), limits)
    np.testing.assert_array_equal(ids.numpy(), full_ids.numpy())
    np.testing.assert_array_equal(scores.numpy(), full_scores.numpy())
    assert [list(row).index(EOS_ID) + 1 for row in ids.numpy()] == [5, 2, 8]
    assert rows_seen == [3, 3, 2, 2, 2, 1, 1, 1]  # the second ends at step 1, the first at 4


@pytest.mark.slow  # traces the model's beam and greedy searches four times each
def test_the_compact_model_searches_find_what_the_full_ones_find():
    model = tiny_model(VOCAB)
    source = source_rows(VOCAB, seed=3, rows=5, width=9)

    # Outputs of at most source length + 10 tokens (the default allows 50 more): the untrained
    # model writes to its limit either way, and the eager searches' steps cost a third.
    def search(shape):
        return lambda s: translate_beam(model, s, 4, 0.6, shape=shape, extra_length=10)

    def greedy(shape):
        return lambda s: translate_greedy(model, s, shape=shape, extra_length=10)

    spec = [tf.TensorSpec([None, None], tf.int32)]
    for mode in (search, greedy):
        full = tf.function(mode(LoopShape), input_signature=spec)(source)
        found = {
            "graph": tf.function(mode(CompactLoop), input_signature=spec)(source),
            # A graph traced for one batch size: its loop variables start with a static size.
            "static batch": tf.function(mode(CompactLoop))(tf.constant(source)),
            "eager": mode(CompactLoop)(tf.constant(source)),
        }
        # The same ids; the same scores up to float32 rounding (products of fewer rows, or
        # eager kernels, may round differently).
        for name, result in found.items():
            np.testing.assert_array_equal(result["ids"].numpy(), full["ids"].numpy(),
                                          err_msg=name)
            np.testing.assert_allclose(result["scores"].numpy(), full["scores"].numpy(),
                                       rtol=1e-6, err_msg=name)
