"""Compiling a search once per backend: a `tf.function` (with XLA inside where asked) on
TensorFlow, `jax.jit` over the model's variables as state on JAX.

Every mode's compiled function (`compiled_greedy_search`, `compiled_beam_search`,
`compiled_sample_search`, `compiled_scorer`, the translator's aligner) goes through
`compile_search`, so the rule of static shapes inside the compiled code and value-dependent
trimming outside it is written once. Where shapes are static (`dynamic_shapes()` is False:
JAX, and TensorFlow under XLA) inputs are padded to a multiple of `XLA_WIDTH_STEP` tokens.
"""

import keras
import numpy as np
from keras import tree

# XLA compiles a search once per input shape: inputs are padded to a multiple of this many
# tokens, so that a few widths (and compilations) serve every sentence.
XLA_WIDTH_STEP = 16


def dynamic_shapes():
    """Whether shapes inside a search may depend on values (TensorFlow's graphs); other
    backends compile every shape statically."""
    return keras.backend.backend() == "tensorflow"


def compile_search(model, search, trim_outputs, jit_compile=False, extra_inputs=()):
    """Compiles `search(source_ids, static, *extra) -> outputs` (a nest of tensors) for `model`.

    `static` tells the search to keep every shape static (caches and buffers of
    `static_max_length`, a body's `static=True`); `trim_outputs` then cuts the value-dependent
    columns of its outputs, outside the compiled loop. `extra_inputs` names the search's other
    inputs as (shape, dtype) pairs, e.g. ((None, None), "int32") for prefix ids or ((),
    "int32") for a seed.

    Returns a function of (source_ids (B, S) int32, *extra):
      TensorFlow: a tf.function traced once for every batch shape; with jit_compile the search
        is compiled by XLA once per input shape inside it. Takes and returns tensors.
      JAX: the search under `jax.jit` (compiled once per input shape; `jit_compile` is
        implied), the model's variables passed in as state (stateless, as `Model.stateless_call`
        does). Takes and returns numpy arrays.
    """
    backend = keras.backend.backend()
    if backend == "jax":
        return _jax_search_function(model, search, trim_outputs)
    if backend != "tensorflow":
        raise NotImplementedError(f"search is implemented for the tensorflow and jax backends, "
                                  f"not {backend!r}.")
    import tensorflow as tf

    signature = [tf.TensorSpec([None, None], tf.int32)] + [
        tf.TensorSpec(shape, dtype) for shape, dtype in extra_inputs]
    if not jit_compile:
        return tf.function(lambda source_ids, *extra: search(source_ids, False, *extra),
                           input_signature=signature)
    compiled = tf.function(lambda source_ids, *extra: search(source_ids, True, *extra),
                           jit_compile=True)

    # Shapes that depend on values, such as trimming padding columns, stay outside XLA.
    @tf.function(input_signature=signature)
    def run(source_ids, *extra):
        return trim_outputs(compiled(source_ids, *extra))

    return run


def _jax_search_function(model, search, trim_outputs):
    import jax

    variables = list(model.variables)

    def stateless_search(values, source_ids, *extra):
        with keras.StatelessScope(state_mapping=list(zip(variables, values))):
            return search(source_ids, True, *extra)

    compiled = jax.jit(stateless_search)

    def run(source_ids, *extra):
        source_ids = np.asarray(source_ids, np.int32)
        outputs = compiled([variable.value for variable in variables], source_ids,
                           *[np.asarray(value) for value in extra])
        return trim_outputs(tree.map_structure(np.asarray, outputs))

    return run
