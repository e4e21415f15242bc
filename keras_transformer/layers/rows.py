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
"""

from keras import ops


def matmul(inputs, kernel):
    """inputs (..., d) x kernel (d, units) on the (N, d) rows. Returns (..., units)."""
    rows = ops.reshape(inputs, (-1, inputs.shape[-1]))
    return ops.reshape(ops.matmul(rows, kernel), _leading(inputs) + (kernel.shape[-1],))


def dense(layer, inputs):
    """What the built `keras.layers.Dense` `layer` computes on `inputs` (..., d): the product
    on the rows, then the bias and the activation, in the layer's compute dtype."""
    dtype = layer.compute_dtype
    outputs = matmul(ops.cast(inputs, dtype), ops.cast(layer.kernel, dtype))
    if layer.use_bias:
        outputs = outputs + ops.cast(layer.bias, dtype)
    return outputs if layer.activation is None else layer.activation(outputs)


def _leading(inputs):
    shape = ops.shape(inputs)
    return tuple(shape[i] for i in range(len(inputs.shape) - 1))
