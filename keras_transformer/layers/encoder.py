"""Encoder layer and encoder stack (paper Section 3.1)."""

import keras

from keras_transformer.dimensions import check_dimensions
from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.embedding import (
    LearnedPositionalEmbedding,
    SinusoidalPositionalEncoding,
)
from keras_transformer.layers.feed_forward import PositionwiseFeedForward, ResidualConnection


def make_positional_layer(positional, max_length, dtype):
    if positional == "sinusoidal":
        return SinusoidalPositionalEncoding(dtype=dtype, name="positional_encoding")
    if positional == "learned":
        if not max_length:
            raise ValueError("positional='learned' needs max_length (the longest position).")
        return LearnedPositionalEmbedding(max_length, dtype=dtype, name="positional_encoding")
    raise ValueError(f"positional={positional!r} must be 'sinusoidal' or 'learned'.")


def _check_rate(name, value):
    if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name}={value!r} must be a number in [0, 1).")


class _LayerSettings:
    """Constructor arguments shared by encoder and decoder layers (kept in get_config)."""

    def _init_settings(
        self, d_model, num_heads, d_ff, key_dim, value_dim, dropout, attention_dropout,
        activation, norm_first, layer_norm_epsilon,
    ):
        self.key_dim, self.value_dim = check_dimensions(d_model, num_heads, key_dim, value_dim)
        _check_rate("dropout", dropout)
        _check_rate("attention_dropout", attention_dropout)
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_ff = d_ff
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation = activation
        self.norm_first = norm_first
        self.layer_norm_epsilon = layer_norm_epsilon

    def _settings_config(self):
        return {
            "d_model": self.d_model,
            "num_heads": self.num_heads,
            "d_ff": self.d_ff,
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
            "dropout": self.dropout,
            "attention_dropout": self.attention_dropout,
            "activation": self.activation,
            "norm_first": self.norm_first,
            "layer_norm_epsilon": self.layer_norm_epsilon,
        }

    def _attention(self, name):
        return MultiHeadAttention(
            self.num_heads, self.key_dim, self.value_dim, dropout=self.attention_dropout,
            dtype=self.dtype_policy, name=name,
        )

    def _residual(self, name):
        return ResidualConnection(
            self.dropout, self.norm_first, self.layer_norm_epsilon,
            dtype=self.dtype_policy, name=name,
        )

    def _feed_forward(self):
        return PositionwiseFeedForward(
            self.d_ff, self.activation, dtype=self.dtype_policy, name="feed_forward"
        )


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(_LayerSettings, keras.layers.Layer):
    """Self-attention then a feed-forward network, each in a residual connection.

    Args:
        d_model, num_heads, d_ff: the paper's sizes.
        key_dim, value_dim: d_k and d_v (default d_model / num_heads).
        dropout: P_drop on each sub-layer output.
        attention_dropout: dropout on attention weights (paper: 0.0).
        activation: FFN activation (paper: "relu").
        norm_first: pre-norm instead of the paper's post-norm.
        layer_norm_epsilon: LayerNorm epsilon.

    Call arguments:
        inputs: (B, S, d_model).
        padding_mask: boolean (B, S), True for real tokens.
        return_attention_scores: also return the self-attention weights (B, H, S, S).
        training: whether dropout is active.
    """

    def __init__(
        self, d_model, num_heads, d_ff, key_dim=None, value_dim=None, dropout=0.1,
        attention_dropout=0.0, activation="relu", norm_first=False, layer_norm_epsilon=1e-6,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self._init_settings(
            d_model, num_heads, d_ff, key_dim, value_dim, dropout, attention_dropout,
            activation, norm_first, layer_norm_epsilon,
        )
        self.self_attention = self._attention("self_attention")
        self.self_attention_residual = self._residual("self_attention_residual")
        self.feed_forward = self._feed_forward()
        self.feed_forward_residual = self._residual("feed_forward_residual")

    def build(self, input_shape):
        for layer in (
            self.self_attention, self.self_attention_residual,
            self.feed_forward, self.feed_forward_residual,
        ):
            layer.build(input_shape)

    def call(self, inputs, padding_mask=None, return_attention_scores=False, training=None):
        x = inputs
        h = self.self_attention_residual.normalize(x)
        h, weights = self.self_attention(
            h, attention_mask=padding_mask, return_attention_scores=True, training=training
        )
        x = self.self_attention_residual(x, h, training=training)
        h = self.feed_forward(self.feed_forward_residual.normalize(x), training=training)
        x = self.feed_forward_residual(x, h, training=training)
        return (x, weights) if return_attention_scores else x

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), **self._settings_config()}


class TransformerStack(keras.layers.Layer):
    """Shared part of the encoder and decoder stacks: positions, embedding dropout, N layers.

    Subclasses set `layer_class` and `layer_prefix` and write `call`.
    """

    layer_class = None
    layer_prefix = None

    def __init__(
        self, num_layers, d_model, num_heads, d_ff, key_dim=None, value_dim=None, dropout=0.1,
        attention_dropout=0.0, activation="relu", norm_first=False, layer_norm_epsilon=1e-6,
        positional="sinusoidal", max_length=None, **kwargs,
    ):
        super().__init__(**kwargs)
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"num_layers={num_layers!r} must be a positive integer.")
        _check_rate("dropout", dropout)
        self.num_layers = num_layers
        self.positional = positional
        self.max_length = max_length
        self.positional_encoding = make_positional_layer(positional, max_length, self.dtype_policy)
        self.embedding_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        self.stack = [
            self.layer_class(
                d_model, num_heads, d_ff, key_dim, value_dim, dropout, attention_dropout,
                activation, norm_first, layer_norm_epsilon, dtype=self.dtype_policy,
                name=f"{self.layer_prefix}_{i}",
            )
            for i in range(num_layers)
        ]
        # Pre-norm leaves the residual stream unnormalized: normalize once at the top.
        self.final_norm = (
            keras.layers.LayerNormalization(
                epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="final_layer_norm"
            )
            if norm_first
            else None
        )

    def build(self, input_shape):
        self.positional_encoding.build(input_shape)
        for layer in self.stack:
            layer.build(input_shape)
        if self.final_norm is not None:
            self.final_norm.build(input_shape)

    def _embed_positions(self, embedded, start_index, training):
        x = self.positional_encoding(embedded, start_index=start_index)
        return self.embedding_dropout(x, training=training)

    def _finish(self, x):
        return x if self.final_norm is None else self.final_norm(x)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "num_layers": self.num_layers,
            **self.stack[0]._settings_config(),
            "positional": self.positional,
            "max_length": self.max_length,
        }


@keras.saving.register_keras_serializable(package="keras_transformer")
class Encoder(TransformerStack):
    """The encoder stack: positions added to embedded tokens, dropout, N encoder layers.

    Args:
        num_layers: N.
        positional: "sinusoidal" (paper) or "learned" (Table 3 row E).
        max_length: longest position for learned positions.
        Other arguments as in `EncoderLayer`.

    Call arguments:
        embedded: token embeddings (B, S, d_model), already scaled by sqrt(d_model).
        padding_mask: boolean (B, S), True for real tokens.
        return_attention_scores: also return a list of per-layer weights (B, H, S, S).
        training: whether dropout is active.

    Returns:
        (B, S, d_model), or (output, weights) with `return_attention_scores`.
    """

    layer_class = EncoderLayer
    layer_prefix = "encoder_layer"

    def call(self, embedded, padding_mask=None, return_attention_scores=False, training=None):
        x = self._embed_positions(embedded, 0, training)
        all_weights = []
        for layer in self.stack:
            x, weights = layer(
                x, padding_mask=padding_mask, return_attention_scores=True, training=training
            )
            all_weights.append(weights)
        x = self._finish(x)
        return (x, all_weights) if return_attention_scores else x
