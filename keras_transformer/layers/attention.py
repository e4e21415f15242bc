"""Scaled dot-product attention and multi-head attention (paper Section 3.2).

One implementation serves training and incremental decoding: `MultiHeadAttention` takes an
optional fixed-size key/value cache that it updates at an index, so step-by-step decoding runs
the same code as the full forward pass.

Mask convention (everywhere in this package): boolean, True = may attend. A padding mask has
shape (B, S) and masks keys only; an attention mask has shape (B, T, S). Both broadcast over
heads.

Two implementations of Eq. 1 give the same numbers: the plain one (einsum, float32 softmax,
einsum), which can return the attention weights (attention pictures and word alignments read
them) and runs everywhere, and `keras.ops.dot_product_attention`, which on JAX with a GPU picks
cuDNN's fused flash-attention kernel (the (B, H, T, S) scores never reach device memory). The
fused one serves a call where it can pay (`fused_attention_applies`: full-length passes of
training and evaluation; a decoding step keeps the plain path); on CPUs the plain path stays.
"""

import math

import keras
from keras import ops

from keras_transformer.layers import rows as on_rows

# "auto": the fused path where `fused_attention_applies` says so; "plain" or "fused": always
# that path (benchmarks compare them; "fused" on a CPU runs Keras' own non-fused kernel).
IMPLEMENTATIONS = ("auto", "plain", "fused")
_implementation = "auto"


def set_attention_implementation(name):
    """Chooses the attention implementation for layers called from now on (a traced step keeps
    the one it was traced with): "auto" (the default), "plain" or "fused"."""
    global _implementation
    if name not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {name!r} is not one of "
                         f"{', '.join(IMPLEMENTATIONS)}.")
    _implementation = name


def attention_implementation():
    return _implementation


def _fused_kernel_here():
    """Whether Keras' dot_product_attention has a fused kernel on this backend and device:
    JAX on a GPU (cuDNN flash attention) or TPU (Splash attention)."""
    if keras.backend.backend() != "jax":
        return False
    import jax

    return jax.default_backend() in ("gpu", "cuda", "tpu")


def fused_attention_applies(query, key, weights_wanted, dropout_active):
    """Whether the fused path serves this call under "auto": a fused kernel exists here, no
    one asks for the weights (the kernel never forms them), no dropout acts on them, the
    compute dtype is bf16 or fp16 (cuDNN's flash kernel takes no float32), heads are a multiple
    of 8 and at most 128 wide, and both lengths are even (cuDNN's training kernel with a mask
    needs it). query, key: (B, H, T, d_k), (B, H, S, d_k)."""
    if weights_wanted or dropout_active or _implementation == "plain":
        return False
    if _implementation == "fused":
        return True
    dtype = keras.backend.standardize_dtype(query.dtype)
    head, length, keys = query.shape[-1], query.shape[2], key.shape[2]
    if dtype not in ("bfloat16", "float16") or head is None or head % 8 or head > 128:
        return False
    if length is None or keys is None or length % 2 or keys % 2:
        return False
    return _fused_kernel_here()


def large_negative(dtype):
    """A finite value that drives softmax to zero without overflowing `dtype`."""
    return -3e4 if keras.backend.standardize_dtype(dtype) == "float16" else -1e9


def _expand_mask(mask):
    """(B, S) or (B, T, S) boolean mask -> (B, 1, T or 1, S), broadcastable over heads."""
    mask = ops.cast(mask, "bool")
    # expand_dims rather than mask[:, None, None, :]: TFLite cannot convert a strided slice
    # that adds axes.
    if len(mask.shape) == 2:
        return ops.expand_dims(ops.expand_dims(mask, 1), 1)
    if len(mask.shape) == 3:
        return ops.expand_dims(mask, 1)
    raise ValueError(
        f"Attention mask must have rank 2 (B, S) or 3 (B, T, S); got shape {mask.shape}."
    )


def plain_attention(query, key, value, attention_mask=None, dropout=None, training=None,
                    dtype=None):
    """Eq. 1 written out: (output (B, H, T, d_v), weights (B, H, T, S)); the softmax in float32,
    the weights cast to `dtype` (default the query's) before `dropout` (a layer) and the
    weighted sum. query (B, H, T, d_k), key (B, H, S, d_k), value (B, H, S, d_v)."""
    dtype = dtype or query.dtype
    d_k = query.shape[-1]
    # Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V
    query = query * ops.cast(1.0 / math.sqrt(d_k), query.dtype)
    scores = ops.einsum("bhtd,bhsd->bhts", query, key)  # (B, H, T, S)
    scores = ops.cast(scores, "float32")
    if attention_mask is not None:
        # An additive bias (0 where allowed) rather than a select: the addition's gradient
        # passes through unchanged, while a select costs a pass over the (B, H, T, S)
        # scores forward and another backward.
        scores = scores + mask_bias(attention_mask)
    weights = ops.cast(ops.softmax(scores, axis=-1), dtype)
    if dropout is not None:
        weights = dropout(weights, training=training)
    output = ops.einsum("bhts,bhsd->bhtd", weights, value)  # (B, H, T, d_v)
    return output, weights


def fused_attention(query, key, value, attention_mask=None):
    """Eq. 1 through `keras.ops.dot_product_attention` (its flash kernel where the backend has
    one): output (B, H, T, d_v), no weights. Same arguments as `plain_attention`, no dropout.

    Keras takes (B, T, H, D): the transposes around the call cancel against those of
    `MultiHeadAttention` under XLA."""
    def heads_second(x):  # (B, H, T, D) <-> (B, T, H, D)
        return ops.transpose(x, (0, 2, 1, 3))

    mask = None if attention_mask is None else _expand_mask(attention_mask)  # (B, 1, T|1, S)
    output = ops.dot_product_attention(
        heads_second(query), heads_second(key), heads_second(value), mask=mask,
        scale=1.0 / math.sqrt(query.shape[-1]))
    return heads_second(output)


def mask_bias(mask):
    """Boolean mask (B, S) or (B, T, S) -> float32 bias (B, 1, 1 or T, S): 0 where True, a
    large negative number where False (its softmax weight is exactly 0)."""
    allowed = ops.cast(_expand_mask(mask), "float32")
    return (1.0 - allowed) * large_negative("float32")


@keras.saving.register_keras_serializable(package="keras_transformer")
class ScaledDotProductAttention(keras.layers.Layer):
    """softmax(Q K^T / sqrt(d_k)) V with boolean masking.

    The layer has no weights. The softmax is computed in float32 whatever the compute dtype
    (so mixed precision stays stable), then cast back. Where `fused_attention_applies` (JAX on a
    GPU, bf16, weights not asked for) the fused kernel computes the same; it returns no
    weights.

    Args:
        dropout: dropout rate on the attention weights (the paper uses none: 0.0).

    Call arguments:
        query: (B, H, T, d_k).
        key: (B, H, S, d_k).
        value: (B, H, S, d_v).
        attention_mask: optional boolean mask, (B, S) or (B, T, S); True = may attend.
        training: whether dropout is active.
        return_weights: whether the caller reads the weights (False lets the fused kernel run).

    Returns:
        (output (B, H, T, d_v), weights (B, H, T, S), or None when the fused kernel ran).

    References:
        Vaswani et al., 2017, Eq. 1.
    """

    def __init__(self, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout} must be in [0, 1).")
        self.dropout = dropout
        self.dropout_layer = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def call(self, query, key, value, attention_mask=None, training=None,
             return_weights=True):
        dropout_active = bool(training) and self.dropout > 0
        if fused_attention_applies(query, key, return_weights, dropout_active):
            return fused_attention(query, key, value, attention_mask), None
        return plain_attention(query, key, value, attention_mask, self.dropout_layer, training,
                               self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "dropout": self.dropout}


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention with an optional key/value cache for incremental decoding.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O,
    head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    The number of heads, d_k and d_v are independent (Table 3 rows A and B).

    Args:
        num_heads: h.
        key_dim: d_k, the size of each query/key head.
        value_dim: d_v, the size of each value head (default: key_dim).
        output_dim: size of the output (default: the query's last dimension, d_model).
        dropout: dropout on the attention weights (paper: 0.0).
        use_bias: whether the projections have biases.

    Call arguments:
        query: (B, T, d_model).
        value: (B, S, d_model), the sequence attended to; defaults to `query` (self-attention).
            Ignored when a cross-attention cache (keys/values precomputed) is passed.
        attention_mask: boolean, (B, S) or (B, T, S); True = may attend.
        cache: optional tuple `(keys, values)` of shapes (B, H, L, d_k) and (B, H, L, d_v).
            With `cache_index`, the keys/values of `query` are written into the cache at
            positions `cache_index .. cache_index + T - 1` and attention runs over the whole
            cache (self-attention decoding; pass a mask hiding the positions not yet written).
            Without `cache_index`, the cache is used as is (precomputed cross-attention
            keys/values, see `compute_key_value`); it may hold one row per R query rows
            (B / R rows: the beams of a sentence share its source), the mask then one row
            per cache row.
        cache_index: int scalar tensor, where to write into the cache.
        return_attention_scores: also return the attention weights (B, H, T, S).
        training: whether dropout is active.
        grow_cache: with `cache_index`, the cache holds the positions before it and those of
            `query` are appended (TensorFlow's graphs without XLA, where shapes may follow
            values): cache_index + T positions after.
        fused_weights: self-attention's `fused_weights()`, made once for a decoding loop.

    Returns:
        `output` (B, T, output_dim); followed by the weights if `return_attention_scores`,
        followed by the updated cache if a cache was passed.
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        output_dim=None,
        dropout=0.0,
        use_bias=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (("num_heads", num_heads), ("key_dim", key_dim)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive integer.")
        if value_dim is not None and (not isinstance(value_dim, int) or value_dim <= 0):
            raise ValueError(f"value_dim={value_dim!r} must be a positive integer or None.")
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim or key_dim
        self.output_dim = output_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.attention = ScaledDotProductAttention(
            dropout, dtype=self.dtype_policy, name="scaled_dot_product_attention"
        )

    def build(self, query_shape):
        # Keys and values are projected from sequences of the same width as the query
        # (d_model), as everywhere in the Transformer.
        d_model = query_shape[-1]
        value_dim_in = d_model
        output_dim = self.output_dim or d_model

        def dense(units, name, input_dim):
            layer = keras.layers.Dense(
                units, use_bias=self.use_bias, dtype=self.dtype_policy, name=name,
                kernel_initializer="glorot_uniform",
            )
            layer.build((None, None, input_dim))
            return layer

        h = self.num_heads
        self.query_dense = dense(h * self.key_dim, "query", d_model)
        self.key_dense = dense(h * self.key_dim, "key", value_dim_in)
        self.value_dense = dense(h * self.value_dim, "value", value_dim_in)
        self.output_dense = dense(output_dim, "output", h * self.value_dim)

    def _split_heads(self, x, head_dim, leading):
        # (B, T, H * D) -> (B, H, T, D); leading: the (B, T) sizes (`rows.leading`)
        x = on_rows.reshape(x, leading + (self.num_heads, head_dim))
        return ops.transpose(x, (0, 2, 1, 3))

    def fused_weights(self, layers=None):
        """(kernel (d_model, sum of units), bias or None) of several Dense projections side by
        side in the compute dtype (default: Q, K, V). A decoding loop makes them once
        (`Decoder.init_cache`), not at every step."""
        layers = layers or (self.query_dense, self.key_dense, self.value_dense)
        dtype = self.compute_dtype
        kernel = ops.concatenate([ops.cast(layer.kernel, dtype) for layer in layers], axis=1)
        bias = (ops.concatenate([ops.cast(layer.bias, dtype) for layer in layers], axis=0)
                if self.use_bias else None)
        return kernel, bias

    def _project_heads(self, inputs, layers, weights=None, sizes=None):
        """inputs (B, T, d_model) through several Dense projections in one matmul (fewer ops
        per step, and one wide matmul runs closer to peak than three narrow ones), each split
        into heads: a tuple of (B, H, T, units / H). The weights stay separate variables.
        `weights`: their `fused_weights`, made already; `sizes`: `rows.leading(inputs)`, where
        the caller has them (read once, shared by the product and every split)."""
        sizes = on_rows.leading(inputs) if sizes is None else sizes
        kernel, bias = weights or self.fused_weights(layers)
        outputs = on_rows.matmul(inputs, kernel, sizes)
        if bias is not None:
            outputs = outputs + bias
        pieces = on_rows.split(outputs, [layer.units for layer in layers])
        return tuple(self._split_heads(piece, layer.units // self.num_heads, sizes)
                     for piece, layer in zip(pieces, layers))

    def compute_key_value(self, value):
        """Projects `value` (B, S, d_model) into per-head keys and values.

        Used once per sentence for encoder-decoder attention during decoding.

        Returns:
            (keys (B, H, S, d_k), values (B, H, S, d_v)).
        """
        return self._project_heads(value, (self.key_dense, self.value_dense))

    def call(
        self,
        query,
        value=None,
        attention_mask=None,
        cache=None,
        cache_index=None,
        return_attention_scores=False,
        training=None,
        grow_cache=False,
        fused_weights=None,
    ):
        rows, length = query_sizes = on_rows.leading(query)
        if cache is not None and cache_index is None:
            keys, values = cache  # precomputed cross-attention keys/values, (B / R, H, S, d)
            # The R query rows of a cache row attend as one sequence of R x T queries: one
            # matrix product per head and source rather than R of a single query each.
            folded = (on_rows.size(keys, 0), -1)  # (B / R, R T)
            query = on_rows.reshape(query, folded + (query.shape[-1],))
            queries = self._split_heads(on_rows.dense(self.query_dense, query, folded),
                                        self.key_dim, folded)  # (B / R, H, R T, d_k)
        else:
            # queries (B, H, T, d_k), keys (B, H, S, d_k), values (B, H, S, d_v)
            if value is None:  # self-attention: Q, K and V in one matmul
                queries, keys, values = self._project_heads(
                    query, (self.query_dense, self.key_dense, self.value_dense),
                    fused_weights, query_sizes)
            else:
                queries = self._split_heads(on_rows.dense(self.query_dense, query, query_sizes),
                                            self.key_dim, query_sizes)
                keys, values = self._project_heads(value, (self.key_dense, self.value_dense))
            if cache is not None:  # written at cache_index, or appended to a growing cache
                keys, values = cache = tuple(
                    ops.concatenate([old, ops.cast(new, old.dtype)], axis=2) if grow_cache
                    else update_cache(old, new, cache_index)
                    for old, new in zip(cache, (keys, values)))

        output, weights = self.attention(
            queries, keys, values, attention_mask=attention_mask, training=training,
            return_weights=return_attention_scores,
        )  # (B, H, T, d_v)
        output = ops.transpose(output, (0, 2, 1, 3))  # (B, T, H, d_v)
        output = on_rows.reshape(output, (rows, length, self.num_heads * self.value_dim))
        output = on_rows.dense(self.output_dense, output, query_sizes)

        results = (output,)
        if return_attention_scores:
            if weights is not None and cache is not None and cache_index is None:
                weights = _unfold_rows(weights, on_rows.value(rows),
                                       on_rows.value(length))  # (B, H, T, S)
            results += (weights,)
        if cache is not None:
            results += (cache,)
        return results[0] if len(results) == 1 else results

    def compute_output_shape(self, query_shape):
        return tuple(query_shape[:-1]) + (self.output_dim or query_shape[-1],)

    def get_config(self):
        return {
            **super().get_config(),
            "num_heads": self.num_heads,
            "key_dim": self.key_dim,
            "value_dim": self.value_dim,
            "output_dim": self.output_dim,
            "dropout": self.dropout,
            "use_bias": self.use_bias,
        }


def _unfold_rows(weights, rows, length):
    """Cross-attention weights of R query rows folded into one row, (B / R, H, R T, S) ->
    (B, H, T, S)."""
    shape = ops.shape(weights)
    weights = ops.reshape(weights, (shape[0], shape[1], -1, length, shape[3]))  # (B/R, H, R,..)
    weights = ops.transpose(weights, (0, 2, 1, 3, 4))  # (B / R, R, H, T, S)
    return ops.reshape(weights, (rows, shape[1], length, shape[3]))


def update_cache(cache, update, index):
    """Writes `update` (B, H, T, D) into `cache` (B, H, L, D) at positions index..index+T-1."""
    zero = ops.zeros((), "int32")
    index = ops.cast(index, "int32")
    return ops.slice_update(cache, (zero, zero, index, zero), ops.cast(update, cache.dtype))
