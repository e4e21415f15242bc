import math

import numpy as np
import pytest

from keras_transformer.layers import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    PositionwiseFeedForward,
    ResidualConnection,
    ScaledDotProductAttention,
    ScaledEmbedding,
    SinusoidalPositionalEncoding,
    causal_mask,
)
from tests.layer_checks import check_layer

B, S, T, D = 2, 5, 4, 16


def rand(*shape):
    return np.random.default_rng(0).normal(size=shape).astype("float32")


def test_scaled_dot_product_attention_matches_formula_and_masks_keys():
    q, k, v = rand(B, 2, T, 8), rand(B, 2, S, 8), rand(B, 2, S, 3)
    mask = np.ones((B, S), bool)
    mask[:, -2:] = False
    layer = ScaledDotProductAttention()
    output = check_layer(layer, (q, k, v), {"attention_mask": mask}, expected_shape=(B, 2, T, 3))
    _, weights = layer(q, k, v, attention_mask=mask)

    scores = np.einsum("bhtd,bhsd->bhts", q, k) / math.sqrt(8)
    scores = np.where(mask[:, None, None, :], scores, -np.inf)
    expected_w = np.exp(scores - scores.max(-1, keepdims=True))
    expected_w /= expected_w.sum(-1, keepdims=True)
    np.testing.assert_allclose(weights, expected_w, atol=1e-6)
    np.testing.assert_allclose(output, expected_w @ v, atol=1e-5)
    assert np.all(np.asarray(weights)[..., -2:] == 0.0)


@pytest.mark.parametrize("num_heads,key_dim,value_dim", [(4, 4, 4), (2, 3, 7), (1, 16, 16)])
def test_multi_head_attention_sizes_are_independent(num_heads, key_dim, value_dim):
    layer = MultiHeadAttention(num_heads, key_dim, value_dim)
    query, value = rand(B, T, D), rand(B, S, D)
    check_layer(layer, (query, value), expected_shape=(B, T, D), expected_weights=8)
    assert layer.query_dense.kernel.shape == (D, num_heads * key_dim)
    assert layer.value_dense.kernel.shape == (D, num_heads * value_dim)
    assert layer.output_dense.kernel.shape == (num_heads * value_dim, D)
    _, weights = layer(query, value, return_attention_scores=True)
    assert weights.shape == (B, num_heads, T, S)


def test_multi_head_attention_cache_equals_full_self_attention():
    layer = MultiHeadAttention(4, 4)
    x = rand(B, T, D)
    full = np.asarray(layer(x, attention_mask=np.asarray(causal_mask(T, T))[None]))
    cache = (np.zeros((B, 4, T, 4), "float32"), np.zeros((B, 4, T, 4), "float32"))
    for i in range(T):
        mask = np.asarray(causal_mask(1, T, i))[None]
        step, cache = layer(x[:, i : i + 1], attention_mask=mask, cache=cache, cache_index=i)
        np.testing.assert_allclose(step[:, 0], full[:, i], atol=1e-5)


def test_sinusoidal_encoding_matches_paper_formula_and_offsets():
    layer = SinusoidalPositionalEncoding()
    zeros = np.zeros((1, 6, 10), "float32")
    pe = np.asarray(check_layer(layer, (zeros,), expected_shape=(1, 6, 10)))[0]
    for pos in range(6):
        for i in range(5):
            angle = pos / 10000 ** (2 * i / 10)
            assert pe[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-5)
            assert pe[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-5)
    shifted = np.asarray(layer(zeros[:, :2], start_index=3))[0]
    np.testing.assert_allclose(shifted, pe[3:5], atol=1e-6)


def test_learned_positional_embedding_offsets():
    layer = LearnedPositionalEmbedding(max_length=8)
    x = rand(B, 3, D)
    check_layer(layer, (x,), expected_shape=(B, 3, D), expected_weights=1)
    table = np.asarray(layer.position_embeddings)
    np.testing.assert_allclose(layer(x, start_index=4), x + table[None, 4:7], atol=1e-6)


def test_scaled_embedding_scales_and_ties_output():
    layer = ScaledEmbedding(11, D)
    ids = np.array([[1, 2, 0]])
    out = check_layer(layer, (ids,), expected_shape=(1, 3, D), expected_weights=1)
    table = np.asarray(layer.embeddings)
    np.testing.assert_allclose(out[0], table[[1, 2, 0]] * math.sqrt(D), rtol=1e-6)
    hidden = rand(1, 2, D)
    np.testing.assert_allclose(layer.logits(hidden), hidden @ table.T, rtol=1e-5, atol=1e-5)


def test_feed_forward_is_relu_mlp():
    layer = PositionwiseFeedForward(32)
    x = rand(B, T, D)
    out = check_layer(layer, (x,), expected_shape=(B, T, D), expected_weights=4)
    w1, b1, w2, b2 = layer.get_weights()
    np.testing.assert_allclose(out, np.maximum(0, x @ w1 + b1) @ w2 + b2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_residual_connection_post_and_pre_norm(norm_first):
    layer = ResidualConnection(dropout=0.0, norm_first=norm_first)
    x, y = rand(B, T, D), rand(B, T, D) + 3.0
    out = np.asarray(check_layer(layer, (x, y), expected_shape=(B, T, D), expected_weights=2))

    def layer_norm(v):
        return (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + 1e-6)

    expected = x + y if norm_first else layer_norm(x + y)
    np.testing.assert_allclose(out, expected, atol=1e-4)
    normalized = np.asarray(layer.normalize(x))
    np.testing.assert_allclose(normalized, layer_norm(x) if norm_first else x, atol=1e-4)


def test_encoder_and_decoder_layers_round_trip():
    x, memory = rand(B, T, D), rand(B, S, D)
    pad = np.ones((B, S), bool)
    check_layer(EncoderLayer(D, 4, 32), (memory,), {"padding_mask": pad}, (B, S, D), 16)
    check_layer(
        DecoderLayer(D, 4, 32, key_dim=3, value_dim=5),
        (x, memory),
        {"cross_attention_mask": pad},
        (B, T, D),
        26,
    )


@pytest.mark.parametrize("norm_first,positional", [(False, "sinusoidal"), (True, "learned")])
def test_stacks_round_trip(norm_first, positional):
    kwargs = dict(norm_first=norm_first, positional=positional, max_length=16)
    memory, x = rand(B, S, D), rand(B, T, D)
    encoder = Encoder(2, D, 4, 32, **kwargs)
    decoder = Decoder(2, D, 4, 32, **kwargs)
    extra = 2 if norm_first else 0
    learned = 1 if positional == "learned" else 0
    check_layer(encoder, (memory,), {}, (B, S, D), 2 * 16 + extra + learned)
    check_layer(decoder, (x, memory), {}, (B, T, D), 2 * 26 + extra + learned)


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: EncoderLayer(510, 8, 2048), "d_model=510 is not divisible by num_heads=8"),
        (lambda: EncoderLayer(512, 8, 2048, dropout=-0.1), "dropout=-0.1"),
        (lambda: Encoder(0, 512, 8, 2048), "num_layers=0"),
        (lambda: MultiHeadAttention(0, 64), "num_heads=0"),
        (lambda: PositionwiseFeedForward(-5), "d_ff=-5"),
        (lambda: Encoder(2, 64, 4, 128, positional="rotary"), "positional='rotary'"),
        (lambda: Encoder(2, 64, 4, 128, positional="learned"), "needs max_length"),
        (lambda: ResidualConnection(dropout=1.5), "dropout=1.5"),
    ],
)
def test_invalid_layer_configurations_raise_value_error(build, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build()
