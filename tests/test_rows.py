"""The lean ops of `layers.rows`: the values of their `keras.ops` counterparts, with fewer graph
nodes (what an export traces and a server's optimizer rewrites)."""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_transformer.layers import rows


def op_types(function, *specs):
    """Op types (with counts) of `function` traced for `specs`, nested functions included."""
    graph = tf.function(function, autograph=False).get_concrete_function(*specs).graph
    definition = graph.as_graph_def()
    nodes = list(definition.node) + [node for function in definition.library.function
                                     for node in function.node_def]
    return collections.Counter(node.op for node in nodes)


def test_take_gives_keras_take_without_the_negative_index_fix_up():
    table = keras.Variable(np.arange(24, dtype="float32").reshape(6, 4))
    indices = np.array([[5, 0], [2, 2]], np.int32)
    np.testing.assert_array_equal(rows.take(table, indices), ops.take(table, indices, axis=0))
    np.testing.assert_array_equal(rows.take(np.arange(10), np.array([3, 1], np.int64)), [3, 1])
    with pytest.raises(tf.errors.InvalidArgumentError):  # out of range: still an error
        rows.take(table, np.array([6], np.int32))

    spec = tf.TensorSpec([None], tf.int32)
    ours = op_types(lambda i: rows.take(tf.ones([6, 4]), i), spec)
    theirs = op_types(lambda i: ops.take(tf.ones([6, 4]), i, axis=0), spec)
    assert ours["GatherV2"] == theirs["GatherV2"] == 1
    assert ours["SelectV2"] == ours["Less"] == 0 < theirs["SelectV2"]


def test_take_per_row_gathers_each_rows_own_indices_in_one_op():
    rng = np.random.default_rng(0)
    for tensor in (rng.normal(size=(3, 5, 4)).astype("float32"),
                   rng.integers(0, 9, size=(3, 5)).astype("int32")):
        indices = rng.integers(0, 5, size=(3, 7)).astype("int32")
        expected = np.take_along_axis(
            tensor, indices.reshape(indices.shape + (1,) * (tensor.ndim - 2)), axis=1)
        np.testing.assert_array_equal(rows.take_per_row(tensor, indices), expected)

    # Shapes unknown when traced (a search's): one GatherV2, no reshape or index arithmetic.
    counts = op_types(rows.take_per_row, tf.TensorSpec([None, None, None], tf.float32),
                      tf.TensorSpec([None, None], tf.int32))
    assert counts["GatherV2"] == 1 and not counts["Reshape"] and not counts["AddV2"]


def test_split_gives_the_pieces_of_ops_split_with_one_splitv():
    x = np.arange(2 * 3 * 9, dtype="float32").reshape(2, 3, 9)
    ours = rows.split(x, [4, 2, 3])
    theirs = ops.split(x, [4, 6], axis=-1)
    assert len(ours) == 3
    for a, b in zip(ours, theirs):
        np.testing.assert_array_equal(a, b)
    counts = op_types(lambda t: rows.split(t, [4, 2, 3]),
                      tf.TensorSpec([None, None, 9], tf.float32))
    assert counts["SplitV"] == 1 and not counts["StridedSlice"] and not counts["ConcatV2"]


def test_a_projection_reshapes_with_sizes_read_once():
    kernel = tf.ones([4, 6])

    def twice(x):  # two products on one input, its sizes read once
        sizes = rows.leading(x)
        return rows.matmul(x, kernel, sizes), rows.matmul(x, kernel, sizes)

    spec = tf.TensorSpec([None, None, 4], tf.float32)
    assert op_types(twice, spec)["Shape"] == 1
    x = np.ones((2, 3, 4), "float32")
    np.testing.assert_array_equal(twice(x)[0], np.full((2, 3, 6), 4.0))
    # One unknown size among static ones: -1, no shape read at all.
    assert op_types(lambda t: rows.matmul(t, kernel), tf.TensorSpec([None, 5, 4]))["Shape"] == 0
