"""TensorFlow's graph building made cheaper in the test workers, without changing what it builds.

Tracing (a `tf.function` turned into a graph) is the largest part of the suite's CPU: 43% of
the workers' samples in a profile of the whole suite, nearly all of it in TensorFlow's Python
that adds one op to a graph (550-900 us an op on a 2-core host; docs/testing.md). Three parts
of that work are spent on things the tests never read:

- `tf_stack.extract_stack`: the Python stack, frame by frame (about 100 deep under pytest),
  recorded on each op for the "defined at" lines of a graph error. Here every op gets one
  stack, recorded once.
- `op_def_library._SatisfiesTypeConstraint` formats the list of an input's allowed types into
  an error message on every call, before it checks the type. Here the check comes first and
  TensorFlow's own function, message and all, runs only when the type is not allowed.
- `auto_control_deps_utils.get_read_write_resource_inputs` asks every op for an attribute that
  most ops lack, and the C API answers with an exception, before it looks for the op's resource
  inputs. Here an op without resource inputs gets its (empty) answer first.

The graphs, their outputs and the errors are TensorFlow's; only a graph error's "defined at"
lines point to where the shared stack was recorded. `KERAS_TRANSFORMER_TEST_GRAPH_BUILDING=
tensorflow` leaves TensorFlow as it ships (to debug a failing trace); child processes always
run it so.
"""

import contextlib
import os

SWITCH = "KERAS_TRANSFORMER_TEST_GRAPH_BUILDING"

# (module, attribute) -> TensorFlow's own function, recorded before the first shortcut.
_SHIPPED = {}


def _targets():
    from tensorflow.python.framework import auto_control_deps_utils, op_def_library
    from tensorflow.python.util import tf_stack

    return ((tf_stack, "extract_stack"), (op_def_library, "_SatisfiesTypeConstraint"),
            (auto_control_deps_utils, "get_read_write_resource_inputs"))


def _shipped():
    """TensorFlow's own functions, in `_targets()`'s order."""
    for module, name in _targets():
        _SHIPPED.setdefault((module.__name__, name), getattr(module, name))
    return [_SHIPPED[module.__name__, name] for module, name in _targets()]


@contextlib.contextmanager
def _functions(replacements):
    """Within the block, `_targets()` are `replacements`; what was there before after it."""
    before = [getattr(module, name) for module, name in _targets()]
    for (module, name), replacement in zip(_targets(), replacements):
        setattr(module, name, replacement)
    try:
        yield
    finally:
        for (module, name), function in zip(_targets(), before):
            setattr(module, name, function)


@contextlib.contextmanager
def as_shipped():
    """Within the block, TensorFlow's own functions (also inside `cheaper_graph_building`)."""
    with _functions(_shipped()):
        yield


@contextlib.contextmanager
def cheaper_graph_building():
    """Within the block, the three shortcuts above are in place (unless SWITCH says
    `tensorflow`); what was there before after it."""
    if os.environ.get(SWITCH) == "tensorflow":
        yield
        return
    from tensorflow.python.framework import dtypes
    from tensorflow.python.util import object_identity

    extract_stack, satisfies, resource_inputs = _shipped()
    shared = extract_stack()

    def one_stack(stacklevel=1):
        return shared

    def satisfies_type_constraint(dtype, attr_def, param_name):
        if (attr_def.HasField("allowed_values")
                and dtype not in attr_def.allowed_values.list.type):
            satisfies(dtype, attr_def, param_name)  # raises TensorFlow's TypeError

    def read_write_resource_inputs(op):
        if any(tensor.dtype == dtypes.resource for tensor in op.inputs):
            return resource_inputs(op)
        return object_identity.ObjectIdentitySet(), object_identity.ObjectIdentitySet()

    with _functions((one_stack, satisfies_type_constraint, read_write_resource_inputs)):
        yield
