"""The Transformer's building blocks as Keras layers."""

from keras_transformer.layers.attention import MultiHeadAttention, ScaledDotProductAttention
from keras_transformer.layers.decoder import Decoder, DecoderLayer, causal_mask
from keras_transformer.layers.embedding import (
    LearnedPositionalEmbedding,
    ScaledEmbedding,
    SinusoidalPositionalEncoding,
)
from keras_transformer.layers.encoder import Encoder, EncoderLayer
from keras_transformer.layers.feed_forward import PositionwiseFeedForward, ResidualConnection

__all__ = [
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "ResidualConnection",
    "ScaledDotProductAttention",
    "ScaledEmbedding",
    "SinusoidalPositionalEncoding",
    "causal_mask",
]
