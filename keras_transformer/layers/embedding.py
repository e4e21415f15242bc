"""Token embeddings and positional encodings (paper Sections 3.4 and 3.5)."""

import math

import keras
from keras import ops

from keras_transformer.layers import rows as on_rows


# From this many rows on, a bfloat16 decoding step computes its logits as x W^T rather than
# (W x^T)^T (`ScaledEmbedding.step_logits`; measured on the amx class).
BF16_ROWS_XWT = 32


@keras.saving.register_keras_serializable(package="keras_transformer")
class ScaledEmbedding(keras.layers.Layer):
    """Learned token embedding multiplied by sqrt(d_model), reusable as the output projection.

    The same matrix can embed source tokens, target tokens and, transposed, turn decoder outputs
    into logits ("we share the same weight matrix between the two embedding layers and the
    pre-softmax linear transformation", Section 3.4).

    Args:
        vocab_size: number of tokens.
        d_model: embedding size.
        scale: multiply embeddings by sqrt(d_model) (the paper: True).

    Call arguments:
        ids: integer token ids (B, T).

    Returns:
        (B, T, d_model) embeddings. `logits(x)` maps (B, T, d_model) to (B, T, vocab_size).
    """

    def __init__(self, vocab_size, d_model, scale=True, **kwargs):
        super().__init__(**kwargs)
        for name, value in (("vocab_size", vocab_size), ("d_model", d_model)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive integer.")
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.scale = scale

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.d_model),
            # N(0, d_model^-0.5): after the sqrt(d_model) scale, embeddings have unit variance,
            # and as output projection the logits start small.
            initializer=keras.initializers.RandomNormal(stddev=self.d_model**-0.5),
        )

    def call(self, ids):
        x = on_rows.take(self.embeddings, ops.cast(ids, "int32"))
        x = ops.cast(x, self.compute_dtype)
        if self.scale:
            x = x * ops.cast(math.sqrt(self.d_model), self.compute_dtype)
        return x

    def logits(self, x):
        """Pre-softmax projection with the tied weights: x W^T."""
        kernel = ops.cast(self.embeddings, x.dtype)
        return ops.matmul(x, ops.transpose(kernel))

    def step_logits(self, x):
        """`logits` for the few rows of a decoding step, computed as (W x^T)^T.

        The same product, ordered for oneDNN: with x of a few hundred rows or less, W x^T runs
        3-7x faster than x W^T (measured at 4-128 rows, V = 8000-37000, float32); with the
        thousands of rows of a training batch, x W^T is the faster one, hence two methods.
        In bfloat16 (the CPUs with bf16 units) from `BF16_ROWS_XWT` rows on, x W^T: there
        oneDNN's transpose of the bf16 (V, rows) product grows with the rows and costs more
        than the product (amx class, V = 37000: 6.6 against 5.1 ms at 32 rows, 47.7 against
        12.8 at 128; below 32 rows (W x^T)^T stays the faster, 1.9 against 2.8 ms at 4).
        """
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        rows = ops.reshape(x, (batch * length, self.d_model))
        kernel = ops.cast(self.embeddings, x.dtype)

        def transposed():
            return ops.transpose(ops.matmul(kernel, ops.transpose(rows)))  # (B * T, V)

        def direct():
            return ops.matmul(rows, ops.transpose(kernel))  # (B * T, V)

        if keras.backend.standardize_dtype(x.dtype) != "bfloat16":
            logits = transposed()
        elif isinstance(batch * length, int):  # a static shape (JAX, XLA)
            logits = direct() if batch * length >= BF16_ROWS_XWT else transposed()
        else:
            logits = ops.cond(batch * length >= BF16_ROWS_XWT, direct, transposed)
        return ops.reshape(logits, (batch, length, self.vocab_size))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.d_model,)

    def get_config(self):
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "d_model": self.d_model,
            "scale": self.scale,
        }


def sinusoidal_table(positions, d_model, dtype="float32"):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(...).

    Args:
        positions: 1-D tensor of positions.
        d_model: encoding size (even or odd).

    Returns:
        (len(positions), d_model) table, sines and cosines interleaved as in the paper.
    """
    positions = ops.cast(positions, "float32")[:, None]  # (T, 1)
    i = ops.arange(0, d_model, 2, dtype="float32")  # 2i
    angles = positions / ops.power(10000.0, i / float(d_model))  # (T, ceil(d/2))
    table = ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1)  # (T, ceil(d/2), 2)
    table = ops.reshape(table, (-1, 2 * angles.shape[-1]))[:, :d_model]
    return ops.cast(table, dtype)


@keras.saving.register_keras_serializable(package="keras_transformer")
class SinusoidalPositionalEncoding(keras.layers.Layer):
    """Adds the paper's fixed sinusoidal position encodings to its input.

    The encodings are computed on the fly, so there is no maximum length and nothing to store.

    Call arguments:
        inputs: (B, T, d_model).
        start_index: position of the first element (int or scalar tensor); step-by-step
            decoding passes the current step.

    Returns:
        inputs + PE[start_index : start_index + T].
    """

    def call(self, inputs, start_index=0):
        length = ops.shape(inputs)[1]
        positions = ops.arange(length) + ops.cast(start_index, "int32")
        table = sinusoidal_table(positions, inputs.shape[-1], self.compute_dtype)
        return inputs + table[None]

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package="keras_transformer")
class LearnedPositionalEmbedding(keras.layers.Layer):
    """Adds learned position embeddings to its input (Table 3 row E).

    Args:
        max_length: number of positions with an embedding; longer inputs are an error.

    Call arguments:
        inputs: (B, T, d_model).
        start_index: position of the first element.

    Returns:
        inputs + P[start_index : start_index + T].
    """

    def __init__(self, max_length, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(max_length, int) or max_length <= 0:
            raise ValueError(f"max_length={max_length!r} must be a positive integer.")
        self.max_length = max_length

    def build(self, input_shape):
        self.position_embeddings = self.add_weight(
            name="position_embeddings",
            shape=(self.max_length, input_shape[-1]),
            initializer=keras.initializers.RandomNormal(stddev=0.02),
        )

    def call(self, inputs, start_index=0):
        length = ops.shape(inputs)[1]
        positions = ops.arange(length) + ops.cast(start_index, "int32")
        table = on_rows.take(self.position_embeddings, positions)
        return inputs + ops.cast(table, self.compute_dtype)[None]

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "max_length": self.max_length}
