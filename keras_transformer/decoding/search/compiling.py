"""Compiling a search once per backend: a `tf.function` (with XLA inside where asked) on
TensorFlow, `jax.jit` over the model's variables as state on JAX.

Every mode's compiled function (`compiled_greedy_search`, `compiled_beam_search`,
`compiled_sample_search`, `compiled_scorer`, the translator's aligner) goes through
`compile_search`, so the rule of static shapes inside the compiled code and value-dependent
trimming outside it is written once.

Where shapes are static (JAX, and TensorFlow under XLA) a search is compiled once per input
shape, so inputs are padded to a few shapes, the buckets (`bucket_rows`, `bucket_width`):
rows to a power of two (at most the batch size, which is a bucket itself), widths to a
multiple of `XLA_WIDTH_STEP` up to 64 tokens and to 1.5x steps above (96, 128, 192, 256, ...).
A padding row repeats the batch's first row (`pad_rows`): each sentence's search is its own
(beam, limits, early termination are per row), so a repeated row changes no other row's
output and adds no step to the loop, which ends when its longest row does; the caller drops
the padding rows (`unpad_rows`). On the Multi30k test set (1,000 lines, batch 64, sorted by
length) that is 3 shapes where exact shapes would be 13; the row buckets also let a window's
short last batch, and a caller's batches of any size, share their shapes.
"""

import keras
import numpy as np
from keras import tree

# XLA compiles a search once per input shape: inputs are padded to a multiple of this many
# tokens (up to WIDE; 1.5x steps above), so that a few widths (and compilations) serve every
# sentence.
XLA_WIDTH_STEP = 16
WIDE = 64


def bucket_width(width, cap=None):
    """The padded width of rows `width` tokens wide: a multiple of XLA_WIDTH_STEP up to WIDE,
    then the next of 96, 128, 192, 256, ... (each 1.5x or 4/3x the last); never more than
    max(cap, width) when `cap` (the model's longest input) is given."""
    width = max(width, 1)
    bucket = -(-width // XLA_WIDTH_STEP) * XLA_WIDTH_STEP
    if bucket > WIDE:
        bucket, half = WIDE, True
        while bucket < width:
            bucket, half = (bucket * 3 // 2, False) if half else (bucket * 4 // 3, True)
    return bucket if cap is None else min(bucket, max(cap, width))


def bucket_rows(rows, batch_size):
    """The padded number of rows of a batch of `rows`: the next power of two, at most
    `batch_size` (itself a bucket); more rows than batch_size (alignments of an n-best list):
    the next power of two."""
    bucket = 1 << max(rows - 1, 0).bit_length()
    return min(bucket, batch_size) if rows <= batch_size else bucket


def pad_rows(array, rows):
    """(n, ...) -> (rows, ...): the first row repeated (see the module docstring)."""
    array = np.asarray(array)
    extra = rows - array.shape[0]
    if extra <= 0:
        return array
    return np.concatenate([array, np.repeat(array[:1], extra, axis=0)])


def unpad_rows(outputs, rows):
    """The first `rows` rows of every tensor (or array) of a search's outputs."""
    return tree.map_structure(lambda value: value[:rows], outputs)


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
    # autograph=False: the searches write their loops and branches as ops (keras.ops'
    # while_loop and cond), so nothing needs AutoGraph's rewriting of Python control flow,
    # which cost about 2 s of every command's first trace.
    if not jit_compile:
        return tf.function(lambda source_ids, *extra: search(source_ids, False, *extra),
                           input_signature=signature, autograph=False)
    compiled = tf.function(lambda source_ids, *extra: search(source_ids, True, *extra),
                           jit_compile=True, autograph=False)

    # Shapes that depend on values, such as trimming padding columns, stay outside XLA.
    @tf.function(input_signature=signature, autograph=False)
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
