"""Position-wise feed-forward network and the residual sub-layer wrapper (Sections 3.1, 3.3)."""

import keras

from keras_transformer.layers import rows


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionwiseFeedForward(keras.layers.Layer):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position separately.

    Args:
        d_ff: inner size.
        activation: inner activation (paper: "relu").
        inner_dropout: dropout after the activation (paper: 0.0; tensor2tensor uses some).

    Call arguments:
        inputs: (B, T, d_model).

    Returns:
        (B, T, d_model).
    """

    def __init__(self, d_ff, activation="relu", inner_dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(d_ff, int) or d_ff <= 0:
            raise ValueError(f"d_ff={d_ff!r} must be a positive integer.")
        if not 0.0 <= inner_dropout < 1.0:
            raise ValueError(f"inner_dropout={inner_dropout} must be in [0, 1).")
        self.d_ff = d_ff
        self.activation = activation
        self.inner_dropout = inner_dropout

    def build(self, input_shape):
        d_model = input_shape[-1]
        self.inner = keras.layers.Dense(
            self.d_ff, activation=self.activation, dtype=self.dtype_policy, name="inner"
        )
        self.inner.build((None, None, d_model))
        self.dropout_layer = keras.layers.Dropout(self.inner_dropout, dtype=self.dtype_policy)
        self.outer = keras.layers.Dense(d_model, dtype=self.dtype_policy, name="outer")
        self.outer.build((None, None, self.d_ff))

    def call(self, inputs, training=None):
        # On the 2-D rows, the bias after the product (`layers.rows` says why).
        sizes = rows.leading(inputs)  # (B, T), read once for both products
        hidden = rows.dense(self.inner, inputs, sizes)  # (B, T, d_ff)
        hidden = self.dropout_layer(hidden, training=training)
        return rows.dense(self.outer, hidden, sizes)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "d_ff": self.d_ff,
            "activation": self.activation,
            "inner_dropout": self.inner_dropout,
        }


@keras.saving.register_keras_serializable(package="keras_transformer")
class ResidualConnection(keras.layers.Layer):
    """Residual connection, dropout and layer normalization around one sub-layer.

    Post-norm (the paper, default): LayerNorm(x + Dropout(Sublayer(x))).
    Pre-norm (`norm_first=True`, a deviation that trains more stably for deep stacks):
    x + Dropout(Sublayer(LayerNorm(x))); the stack then ends with a final LayerNorm.

    Usage inside a layer:

        h = self.residual.normalize(x)       # identity for post-norm
        y = sublayer(h)
        x = self.residual(x, y)             # adds, drops out and (post-norm) normalizes

    Args:
        dropout: P_drop, applied to the sub-layer output before the addition.
        norm_first: pre-norm instead of the paper's post-norm.
        epsilon: LayerNorm epsilon.

    Call arguments:
        inputs: the sub-layer's input x (B, T, d_model).
        sublayer_output: Sublayer(x) (B, T, d_model).
        training: whether dropout is active.
    """

    def __init__(self, dropout=0.1, norm_first=False, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout} must be in [0, 1).")
        self.dropout = dropout
        self.norm_first = norm_first
        self.epsilon = epsilon
        self.layer_norm = keras.layers.LayerNormalization(
            epsilon=epsilon, dtype=self.dtype_policy, name="layer_norm"
        )
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def build(self, input_shape):
        self.layer_norm.build(input_shape)

    def normalize(self, inputs):
        """The sub-layer's input: LayerNorm(x) with pre-norm, x itself with post-norm."""
        return self.layer_norm(inputs) if self.norm_first else inputs

    def call(self, inputs, sublayer_output, training=None):
        output = inputs + self.dropout_layer(sublayer_output, training=training)
        return output if self.norm_first else self.layer_norm(output)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {
            **super().get_config(),
            "dropout": self.dropout,
            "norm_first": self.norm_first,
            "epsilon": self.epsilon,
        }
