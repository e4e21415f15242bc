"""The two attention implementations give the same numbers: the plain one (einsum, float32
softmax) and `keras.ops.dot_product_attention` (the fused flash kernel on a GPU under JAX; on a
CPU Keras' own composition of the same ops). The weights are still returned where asked, and a
CPU keeps the plain path under "auto"."""

import numpy as np
import pytest
from keras import ops

from keras_transformer.layers import MultiHeadAttention, causal_mask
from keras_transformer.layers import attention
from keras_transformer.layers.attention import (fused_attention, fused_attention_applies,
                                                plain_attention, set_attention_implementation)

B, H, T, S, D = 3, 4, 6, 8, 16


def rand(*shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape).astype("float32")


def padding_mask(batch, length, real):
    return np.arange(length)[None, :] < np.asarray(real)[:, None]  # (B, L), True = real


@pytest.fixture
def implementation():
    """Sets the attention implementation for one test and puts "auto" back after it."""
    yield set_attention_implementation
    set_attention_implementation("auto")


@pytest.mark.parametrize("mask_kind", ["none", "padding", "causal+padding"])
def test_fused_equals_plain_attention(mask_kind):
    q, k, v = rand(B, H, T, D, seed=1), rand(B, H, S, D, seed=2), rand(B, H, S, D, seed=3)
    mask = None
    if mask_kind == "padding":
        mask = padding_mask(B, S, [8, 5, 1])  # (B, S)
    elif mask_kind == "causal+padding":
        k, v = k[:, :, :T], v[:, :, :T]
        mask = np.logical_and(np.asarray(causal_mask(T, T))[None],
                              padding_mask(B, T, [6, 4, 2])[:, None, :])  # (B, T, T)
    plain, weights = plain_attention(q, k, v, mask)
    fused = fused_attention(q, k, v, mask)
    assert fused.shape == plain.shape
    np.testing.assert_allclose(ops.convert_to_numpy(fused), ops.convert_to_numpy(plain),
                               atol=2e-5, rtol=1e-5)
    if mask is not None:  # masked keys carry no weight
        expanded = np.broadcast_to(mask[:, None, None, :] if mask.ndim == 2 else mask[:, None],
                                   weights.shape)
        assert np.all(ops.convert_to_numpy(weights)[~expanded] == 0.0)


def test_fused_equals_plain_gradients():
    import keras

    if keras.backend.backend() != "tensorflow":
        pytest.skip("the gradient is taken with tf.GradientTape")
    import tensorflow as tf

    q, k, v = (tf.constant(rand(B, H, T, D, seed=s)) for s in (4, 5, 6))
    mask = np.logical_and(np.asarray(causal_mask(T, T))[None],
                          padding_mask(B, T, [6, 3, 5])[:, None, :])
    upstream = tf.constant(rand(B, H, T, D, seed=7))

    def gradients(fn):
        with tf.GradientTape() as tape:
            tape.watch([q, k, v])
            loss = tf.reduce_sum(fn(q, k, v, mask) * upstream)
        return tape.gradient(loss, [q, k, v])

    for fused, plain in zip(gradients(fused_attention),
                            gradients(lambda *a: plain_attention(*a)[0])):
        np.testing.assert_allclose(fused.numpy(), plain.numpy(), atol=5e-5, rtol=1e-4)


def test_layer_gives_the_same_output_either_way_and_weights_where_asked(implementation):
    layer = MultiHeadAttention(H, D // H * 2)
    x, memory = rand(B, T, D, seed=8), rand(B, S, D, seed=9)
    mask = padding_mask(B, S, [8, 2, 7])
    implementation("plain")
    plain = ops.convert_to_numpy(layer(x, memory, attention_mask=mask))
    plain_out, plain_weights = layer(x, memory, attention_mask=mask, return_attention_scores=True)
    implementation("fused")
    fused = ops.convert_to_numpy(layer(x, memory, attention_mask=mask))
    np.testing.assert_allclose(fused, plain, atol=2e-5, rtol=1e-5)
    # Asked for the weights, the layer takes the plain path whatever the setting.
    out, weights = layer(x, memory, attention_mask=mask, return_attention_scores=True)
    assert weights is not None and tuple(weights.shape) == (B, H, T, S)
    np.testing.assert_allclose(ops.convert_to_numpy(weights),
                               ops.convert_to_numpy(plain_weights), atol=1e-6)
    np.testing.assert_allclose(ops.convert_to_numpy(out), plain, atol=2e-5, rtol=1e-5)


def test_auto_keeps_the_plain_path_on_a_cpu_and_where_the_kernel_cannot_serve(implementation):
    bf16 = ops.cast(rand(B, H, T, D), "bfloat16")
    # This machine has no GPU: under "auto" every call takes the plain path.
    assert not fused_attention_applies(bf16, bf16, weights_wanted=False, dropout_active=False)
    implementation("fused")
    assert fused_attention_applies(bf16, bf16, weights_wanted=False, dropout_active=False)
    # Never when the weights are wanted or dropout acts on them (the kernel forms neither).
    assert not fused_attention_applies(bf16, bf16, weights_wanted=True, dropout_active=False)
    assert not fused_attention_applies(bf16, bf16, weights_wanted=False, dropout_active=True)
    with pytest.raises(ValueError, match="'flash' is not one of auto, plain, fused"):
        set_attention_implementation("flash")
    assert attention.attention_implementation() == "fused"
