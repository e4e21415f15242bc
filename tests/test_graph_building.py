"""The test workers' cheaper graph building (tests/graph_building.py) builds what TensorFlow
builds: the same nodes and control edges, the same outputs, TensorFlow's own type errors."""

import pytest
import tensorflow as tf

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
