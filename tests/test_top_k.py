"""The beam step's top-k in two stages (`search.top_k.best_continuations`): exactly the one
top-k over every (beam, token) sum: the same values, indices and order, ties included."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.decoding.search.rules import NEG_INF
from keras_transformer.decoding.search.top_k import (best_continuations,
                                                     best_continuations_without, chunk_size)

ROOT = pathlib.Path(__file__).resolve().parents[1]


def one_top_k(alive, log_probs, count):
    rows, beams, vocab = log_probs.shape
    values, indices = tf.math.top_k(tf.reshape(alive[:, :, None] + log_probs,
                                               (rows, beams * vocab)), count)
    return values.numpy(), indices.numpy()


def check(alive, log_probs, count):
    alive, log_probs = tf.constant(alive, tf.float32), tf.constant(log_probs, tf.float32)
    values, indices = best_continuations(alive, log_probs, count)
    expected_values, expected_indices = one_top_k(alive, log_probs, count)
    np.testing.assert_array_equal(np.asarray(values), expected_values)
    np.testing.assert_array_equal(np.asarray(indices), expected_indices)


def check_without(alive, log_probs, count, token):
    """One token left out: the values, indices and each beam's best of the masked scores."""
    alive, log_probs = tf.constant(alive, tf.float32), tf.constant(log_probs, tf.float32)
    masked = tf.where(tf.range(log_probs.shape[-1]) == token, NEG_INF, log_probs)
    values, indices, best = best_continuations_without(alive, log_probs, count, token)
    expected_values, expected_indices = one_top_k(alive, masked, count)
    np.testing.assert_array_equal(np.asarray(values), expected_values)
    np.testing.assert_array_equal(np.asarray(indices), expected_indices)
    np.testing.assert_array_equal(np.asarray(best), tf.argmax(masked, axis=2).numpy())


@pytest.mark.parametrize("vocab", [256, 40])  # in chunks; tiny: the one top-k
def test_one_token_left_out_as_if_masked(vocab):
    rng = np.random.default_rng(vocab)
    log_probs = np.log(rng.dirichlet(np.ones(vocab) * 0.1, size=(5, 4))).astype(np.float32)
    alive = rng.normal(-3.0, 2.0, size=(5, 4)).astype(np.float32)
    alive[:, 3:] = NEG_INF
    log_probs[:, :, 2] = 0.0  # the left-out token is every beam's best
    log_probs[0, 1, :] = NEG_INF  # a beam with nothing (a limit's row: only EOS allowed)
    for token in (2, 70 % vocab, vocab - 1):
        check_without(alive, np.maximum(log_probs, NEG_INF), 8, token)
    ties = -rng.integers(0, 2, size=(3, 4, vocab)).astype(np.float32)  # ties everywhere
    check_without(np.zeros((3, 4), np.float32), ties, 8, 2)


def test_chunk_sizes():
    assert chunk_size(8000) == 64 and chunk_size(37000) == 74 and chunk_size(32000) == 64
    assert chunk_size(40) is None and chunk_size(7919) is None  # tiny, prime: one top-k
    assert all(v // chunk_size(v) >= 4 for v in (256, 8000))


@pytest.mark.parametrize("seed", range(4))
def test_the_same_as_one_top_k_on_random_scores(seed):
    rng = np.random.default_rng(seed)
    beams = 4
    log_probs = np.log(rng.dirichlet(np.ones(512) * 0.1, size=(6, beams))).astype(np.float32)
    alive = rng.normal(-3.0, 2.0, size=(6, beams)).astype(np.float32)
    alive[:, 2:] = NEG_INF if seed % 2 else alive[:, 2:]  # beams not alive yet (first step)
    check(alive, np.maximum(log_probs, NEG_INF), 2 * beams)


def test_ties_go_to_the_lower_index_as_in_one_top_k():
    # Integer scores tie everywhere: within a chunk, across chunks and across beams, so the
    # order rests on the indices alone.
    rng = np.random.default_rng(5)
    log_probs = -rng.integers(0, 3, size=(3, 4, 256)).astype(np.float32)
    alive = -rng.integers(0, 2, size=(3, 4)).astype(np.float32)
    check(alive, log_probs, 8)
    check(np.zeros((3, 4), np.float32), np.zeros((3, 4, 256), np.float32), 8)
    # A later chunk ranks first by its best, and its second best ties with an earlier
    # chunk's: the earlier token still comes first.
    log_probs = np.full((1, 2, 256), -10.0, np.float32)
    log_probs[0, 0, [0, 1, 200, 201]] = [-1.0, -5.0, -0.5, -5.0]
    check(np.zeros((1, 2), np.float32), log_probs, 4)


def test_banned_tokens_and_a_count_given_as_a_tensor():
    rng = np.random.default_rng(6)
    log_probs = np.log(rng.dirichlet(np.ones(320), size=(2, 3))).astype(np.float32)
    log_probs[:, :, :2] = NEG_INF  # PAD and BOS
    log_probs[1, :, 3:] = NEG_INF  # a sentence at its limit: only EOS
    alive = rng.normal(size=(2, 3)).astype(np.float32)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32),
                                  tf.TensorSpec([None, None, 320], tf.float32),
                                  tf.TensorSpec([], tf.int32)])
    def in_a_graph(alive, log_probs, count):
        return best_continuations(alive, log_probs, count)

    values, indices = in_a_graph(alive, log_probs, tf.constant(6))
    expected_values, expected_indices = one_top_k(tf.constant(alive), tf.constant(log_probs), 6)
    np.testing.assert_array_equal(values.numpy(), expected_values)
    np.testing.assert_array_equal(indices.numpy(), expected_indices)


@pytest.mark.slow  # a JAX subprocess (a few seconds)
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_the_same_under_jax():
    script = """
import numpy as np
from keras import ops
from keras_transformer.decoding.search.top_k import best_continuations
rng = np.random.default_rng(3)
log_probs = -rng.integers(0, 4, size=(5, 4, 512)).astype(np.float32)
log_probs[:, :, 100:300] += np.log(rng.dirichlet(np.ones(200), size=(5, 4))).astype(np.float32)
alive = rng.normal(size=(5, 4)).astype(np.float32)
values, indices = best_continuations(ops.convert_to_tensor(alive),
                                     ops.convert_to_tensor(log_probs), 8)
expected = ops.top_k(ops.reshape(alive[:, :, None] + log_probs, (5, -1)), k=8)
assert np.array_equal(np.asarray(values), np.asarray(expected[0]))
assert np.array_equal(np.asarray(indices), np.asarray(expected[1])), (indices, expected[1])
print("same")
"""
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "same" in done.stdout, done.stderr[-3000:]
