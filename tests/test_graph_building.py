"""The test workers' cheaper graph building (tests/graph_building.py) builds what TensorFlow
builds: the same nodes and control edges, the same outputs, TensorFlow's own type errors. The
workers run graphs without TensorFlow's graph optimizer (tests/conftest.py), and a graph gives
the same numbers, within float rounding, either way."""

import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import graph_optimizer_off_in_workers, set_graph_optimizer
from tests.graph_building import SWITCH, as_shipped, cheaper_graph_building


def traced(shortcuts):
    """A function with constants, reductions, a type-constrained op and ordered variable
    updates, traced with the shortcuts or with TensorFlow's own functions (the test workers
    run with the shortcuts): (its graph's nodes, its output)."""
    counter = tf.Variable(1.0)

    def body(x):
        for _ in range(20):
            x = tf.nn.relu(x * 1.5 + tf.reduce_mean(x))
        counter.assign_add(1.0)
        counter.assign(counter * 2.0)  # ordered after the add: automatic control dependencies
        return x + counter.read_value()

    function = tf.function(body, autograph=False)
    with cheaper_graph_building() if shortcuts else as_shipped():
        concrete = function.get_concrete_function(tf.TensorSpec([None, 4]))
    nodes = sorted((node.name, node.op, tuple(node.input))
                   for node in concrete.graph.as_graph_def().node)
    return nodes, concrete(tf.ones([2, 4])).numpy().tolist()


def test_the_shortcuts_build_the_same_graph_and_outputs(monkeypatch):
    monkeypatch.delenv(SWITCH, raising=False)
    with_shortcuts = traced(True)
    assert with_shortcuts == traced(False)
    assert any(name.startswith("^") for _, _, inputs in with_shortcuts[0] for name in inputs)


def test_a_type_not_allowed_gets_tensorflows_error(monkeypatch):
    monkeypatch.delenv(SWITCH, raising=False)
    def add_booleans():
        function = tf.function(lambda x: tf.math.add(x, x), autograph=False)
        with pytest.raises(TypeError) as raised:
            function.get_concrete_function(tf.TensorSpec([2], tf.bool))
        return str(raised.value)

    with as_shipped():
        shipped = add_booleans()
    with cheaper_graph_building():
        assert add_booleans() == shipped
    assert "not in list of allowed values: bfloat16" in shipped


def test_the_workers_run_graphs_without_the_graph_optimizer_and_get_the_same_numbers():
    if not graph_optimizer_off_in_workers():
        pytest.skip("KERAS_TRANSFORMER_TEST_GRAPH_OPTIMIZER=on: the optimizer is on here")
    assert tf.config.optimizer.get_experimental_options()["disable_meta_optimizer"] is True
    inputs = tf.random.stateless_normal([8, 16], seed=[1, 2])
    weights = tf.random.stateless_normal([16, 16], seed=[3, 4])

    def layers(x):  # matrix products, biases and activations: what the optimizer fuses
        for _ in range(4):
            x = tf.nn.relu(tf.matmul(x, weights) + 0.1) - 0.5 * tf.reduce_mean(x, axis=-1,
                                                                                 keepdims=True)
        return tf.nn.softmax(x)

    without = tf.function(layers)(inputs).numpy()  # a new function: its first run is now
    set_graph_optimizer(True)
    try:
        assert tf.config.optimizer.get_experimental_options()["disable_meta_optimizer"] is False
        with_optimizer = tf.function(layers)(inputs).numpy()
    finally:
        set_graph_optimizer(False)
    np.testing.assert_allclose(without, with_optimizer, rtol=1e-5, atol=1e-7)
    assert not np.array_equal(without, np.zeros_like(without))


def test_a_test_can_turn_the_graph_optimizer_back_on(graph_optimizer_on):
    assert tf.config.optimizer.get_experimental_options()["disable_meta_optimizer"] is False
