"""Projections of (..., d) activations computed on their 2-D rows, the bias added after the
product.

Two measured reasons (TensorFlow 2.21 on CPU, amx class):
- a matmul of a rank-3 input runs as a tensordot, half a dozen shape ops around the same 2-D
  matmul, and a decoding step is mostly such small ops;
- a 2-D matmul followed by its bias (and ReLU) is fused by TensorFlow's graph rewriter into one
  oneDNN `_FusedMatMul`, which in bfloat16 is the slower form at every size measured: 4 rows of
  a base feed-forward 0.57 against 0.45 ms, 4,096 rows 40.6 against 35.5 ms. The bias is
  therefore added after the reshape back to the input's rank, which the rewriter does not fuse.

    outputs = dense(layer.inner, inputs)         # a built keras.layers.Dense on (B, T, d)
    outputs = matmul(inputs, kernel)             # a kernel of several Dense side by side

The module also holds the lean forms of the shape and gather ops a decoding step runs many
times (`reshape`, `split`, `take`, `take_per_row`): the same values as `keras.ops`' with fewer graph
nodes, which an export traces, saves and loads and a server's graph optimizer rewrites.
"""

import keras
from keras import ops


def matmul(inputs, kernel, sizes=None):
    """inputs (..., d) x kernel (d, units) on the (N, d) rows. Returns (..., units).
    sizes: `leading(inputs)`, where the caller has them already."""
    rows = ops.reshape(inputs, (-1, inputs.shape[-1]))
    sizes = leading(inputs) if sizes is None else sizes
    return reshape(ops.matmul(rows, kernel), sizes + (kernel.shape[-1],))


def dense(layer, inputs, sizes=None):
    """What the built `keras.layers.Dense` `layer` computes on `inputs` (..., d): the product
    on the rows, then the bias and the activation, in the layer's compute dtype. sizes: as
    for `matmul`."""
    dtype = layer.compute_dtype
    outputs = matmul(ops.cast(inputs, dtype), ops.cast(layer.kernel, dtype), sizes)
    if layer.use_bias:
        outputs = outputs + ops.cast(layer.bias, dtype)
    return outputs if layer.activation is None else layer.activation(outputs)


def reshape(tensor, dims):
    """`ops.reshape(tensor, dims)`, dims being Python ints (static sizes) and `size`s: a single
    unknown size among positive ints becomes -1, so the graph holds no Shape, StridedSlice and
    Pack ops for it (a decoding step runs a few dozen such reshapes); several are read from
    their tensors' shapes."""
    unknown = [i for i, dim in enumerate(dims) if isinstance(dim, Size)]
    if len(unknown) == 1 and all(dim > 0 for dim in dims if isinstance(dim, int)):
        return ops.reshape(tensor, tuple(-1 if isinstance(dim, Size) else dim for dim in dims))
    return ops.reshape(tensor, tuple(value(dim) for dim in dims))


class Size:
    """An axis's size that has no static value: `value()` reads it from the graph, through a
    `Shape` that the sizes of one tensor share (one read of its shape, made only if needed)."""

    def __init__(self, shape, axis):
        self.shape, self.axis = shape, axis

    def value(self):
        return self.shape[self.axis]


class Shape:
    """A tensor's dynamic shape, read once, when first indexed."""

    def __init__(self, tensor):
        self.tensor, self._sizes = tensor, None

    def __getitem__(self, axis):
        if self._sizes is None:
            self._sizes = ops.shape(self.tensor)
        return self._sizes[axis]


def size(tensor, axis, shape=None):
    """tensor's size along axis: an int where static, else a `Size` (for `reshape`); `shape`:
    the tensor's `Shape`, where several sizes of it are taken."""
    if tensor.shape[axis] is not None:
        return tensor.shape[axis]
    return Size(shape if shape is not None else Shape(tensor), axis)


def value(dim):
    """An int, or a `Size`'s value as a scalar tensor."""
    return dim.value() if isinstance(dim, Size) else dim


def leading(inputs):
    """The sizes (`size`) of every axis of `inputs` but the last."""
    shape = Shape(inputs)
    return tuple(size(inputs, i, shape) for i in range(len(inputs.shape) - 1))


def split(tensor, sizes, axis=-1):
    """`tensor` cut along `axis` into pieces of the Python ints `sizes`: one SplitV of constant
    sizes on TensorFlow, where `ops.split` turns its cut points into sizes in the graph (a
    StridedSlice and a subtraction per piece, and a concatenation)."""
    if keras.backend.backend() != "tensorflow":
        return ops.split(tensor, [sum(sizes[:i + 1]) for i in range(len(sizes) - 1)], axis=axis)
    import tensorflow as tf

    return tf.split(tensor, list(sizes), axis=axis)


def take(tensor, indices, axis=0):
    """`ops.take(tensor, indices, axis)` for indices known to be in range (0 <= i < size).

    Keras' TensorFlow take first maps negative indices (a Shape, a StridedSlice, a Less, an
    AddV2 and a SelectV2 around the GatherV2, each run at every call); here TensorFlow gathers
    directly (an index out of range is still an error on CPU). Other backends: `ops.take`.
    """
    if keras.backend.backend() != "tensorflow":
        return ops.take(tensor, indices, axis=axis)
    import tensorflow as tf

    return tf.gather(ops.convert_to_tensor(tensor), indices, axis=axis)


def take_per_row(tensor, indices):
    """tensor[b, indices[b, j]]: (B, N, ...) and (B, M) -> (B, M, ...), indices in range.

    TensorFlow: one GatherV2 with batch_dims=1. Other backends: one take of the rows
    b * N + indices[b, j] of the (B * N, ...) reshape (their take_along_axis broadcasts the
    indices over the trailing axes first).
    """
    indices = ops.cast(indices, "int32")
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.gather(ops.convert_to_tensor(tensor), indices, axis=1, batch_dims=1)
    shape = ops.shape(tensor)
    rows = indices + ops.arange(shape[0], dtype="int32")[:, None] * shape[1]
    return ops.take(ops.reshape(tensor, (-1,) + tuple(shape[2:])), rows, axis=0)
