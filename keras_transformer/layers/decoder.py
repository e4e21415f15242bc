"""Decoder layer and decoder stack (paper Section 3.1), with incremental-decoding caches."""

import keras
from keras import ops

from keras_transformer.layers.encoder import TransformerStack, _LayerSettings


def causal_mask(query_length, key_length, start_index=0):
    """Boolean (T, L) mask: query t (at position start_index + t) may attend keys 0..its position.

    With start_index=0 and T == L this is the usual lower-triangular mask; during cached
    decoding the keys are the whole fixed-size cache and start_index is the current step.
    """
    query_positions = ops.arange(query_length) + ops.cast(start_index, "int32")
    key_positions = ops.arange(key_length)
    return key_positions[None, :] <= query_positions[:, None]


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(_LayerSettings, keras.layers.Layer):
    """Masked self-attention, encoder-decoder attention, then a feed-forward network.

    Arguments as in `EncoderLayer`.

    Call arguments:
        inputs: (B, T, d_model).
        encoder_output: (B, S, d_model); may be None when `cross_cache` is given.
        self_attention_mask: boolean (B, T, T) or (B, T, L) with a cache; True = may attend.
        cross_attention_mask: boolean (B, S) source padding mask (or (B, T, S)).
        self_cache: optional (keys, values), each (B, H, L, d), updated at `cache_index`.
        cross_cache: optional precomputed (keys, values) of the encoder output.
        cache_index: where the current tokens go in `self_cache`.
        return_attention_scores: also return (self weights, cross weights).
        training: whether dropout is active.
        grow_cache: `self_cache` grows (`MultiHeadAttention`'s `grow_cache`).
        fused_weights: the self-attention's `fused_weights()`, made once for a decoding loop.

    Returns:
        output (B, T, d_model); then (self_weights, cross_weights) if
        `return_attention_scores`; then the updated self cache if `self_cache` was passed.
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
        self.cross_attention = self._attention("cross_attention")
        self.cross_attention_residual = self._residual("cross_attention_residual")
        self.feed_forward = self._feed_forward()
        self.feed_forward_residual = self._residual("feed_forward_residual")

    def build(self, input_shape):
        for layer in (
            self.self_attention, self.self_attention_residual,
            self.cross_attention, self.cross_attention_residual,
            self.feed_forward, self.feed_forward_residual,
        ):
            layer.build(input_shape)

    def compute_cross_key_value(self, encoder_output):
        """Encoder-decoder keys/values, computed once per sentence for decoding."""
        return self.cross_attention.compute_key_value(encoder_output)

    def call(
        self, inputs, encoder_output=None, self_attention_mask=None, cross_attention_mask=None,
        self_cache=None, cross_cache=None, cache_index=None, return_attention_scores=False,
        training=None, grow_cache=False, fused_weights=None,
    ):
        x = inputs
        h = self.self_attention_residual.normalize(x)
        if self_cache is None:
            h, self_weights = self.self_attention(
                h, attention_mask=self_attention_mask, return_attention_scores=True,
                training=training,
            )
        else:
            h, self_weights, self_cache = self.self_attention(
                h, attention_mask=self_attention_mask, cache=self_cache,
                cache_index=cache_index, return_attention_scores=True, training=training,
                grow_cache=grow_cache, fused_weights=fused_weights,
            )
        x = self.self_attention_residual(x, h, training=training)

        h = self.cross_attention_residual.normalize(x)
        h, cross_weights = self.cross_attention(
            h, encoder_output, attention_mask=cross_attention_mask, cache=cross_cache,
            return_attention_scores=True, training=training,
        )[:2]
        x = self.cross_attention_residual(x, h, training=training)

        h = self.feed_forward(self.feed_forward_residual.normalize(x), training=training)
        x = self.feed_forward_residual(x, h, training=training)

        results = (x,)
        if return_attention_scores:
            results += ((self_weights, cross_weights),)
        if self_cache is not None:
            results += (self_cache,)
        return results[0] if len(results) == 1 else results

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), **self._settings_config()}


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(TransformerStack):
    """The decoder stack: positions added to embedded tokens, dropout, N decoder layers.

    Arguments as in `Encoder`.

    Call arguments:
        embedded: target token embeddings (B, T, d_model), scaled by sqrt(d_model).
        encoder_output: (B, S, d_model); may be None when `cache` holds cross keys/values.
        target_padding_mask: boolean (B, T), True for real tokens (full-sequence mode).
        source_padding_mask: boolean (B, S), True for real tokens.
        cache: optional decoding cache from `init_cache`: a dict with "self" and "cross",
            each a tuple with one (keys, values) pair per layer.
        grow_cache: the self caches grow (`init_cache`'s `grow`; its "grow").
        cache_index: position of the first token of `embedded` (with a cache).
        return_attention_scores: also return per-layer (self, cross) weights.
        training: whether dropout is active.

    Returns:
        output (B, T, d_model); then the weights list if `return_attention_scores`; then the
        updated cache if a cache was passed.
    """

    layer_class = DecoderLayer
    layer_prefix = "decoder_layer"

    def init_cache(self, encoder_output, max_length, rows_per_sentence=1, grow=False):
        """An empty self-attention cache of `max_length` positions plus cross keys/values.

        Args:
            encoder_output: (B, S, d_model).
            max_length: the longest target (in tokens) the cache can hold.
            grow: a cache of no positions that each step extends (`MultiHeadAttention`'s
                `grow_cache`; the dict says so under "grow"): a step then attends over and
                beam search reorders the positions written so far, not `max_length`. Where
                shapes may follow values only (TensorFlow's graphs): `max_length` must be
                a tensor there, so that the empty length has no static value and the loop
                may change it.
            rows_per_sentence: R, decoder rows per sentence (beams): the self-attention
                cache has B x R rows (row b * R + r: sentence b), the cross keys/values one
                per sentence (the R rows share them; `MultiHeadAttention`'s cache).

        Returns:
            {"self": ((keys, values), ...), "cross": ((keys, values), ...), "fused":
            ((kernel, bias), ...)}, one per layer (the last: the self-attention's Q/K/V
            kernels side by side), and "grow": True with `grow`.
        """
        batch = ops.shape(encoder_output)[0] * rows_per_sentence
        first = self.stack[0]
        dtype = self.compute_dtype
        length = max_length * 0 if grow else max_length  # no static value: see `grow`

        def empty(head_dim):
            return ops.zeros((batch, first.num_heads, length, head_dim), dtype)

        self_cache = tuple(
            (empty(first.key_dim), empty(first.value_dim)) for _ in self.stack
        )
        cross_cache = tuple(
            layer.compute_cross_key_value(encoder_output) for layer in self.stack
        )
        # The self-attention's Q/K/V kernels side by side, made once rather than per step.
        fused = tuple(layer.self_attention.fused_weights() for layer in self.stack)
        cache = {"self": self_cache, "cross": cross_cache, "fused": fused}
        return dict(cache, grow=True) if grow else cache  # a Python value: only when True

    def call(
        self, embedded, encoder_output=None, target_padding_mask=None, source_padding_mask=None,
        cache=None, cache_index=None, return_attention_scores=False, training=None,
        grow_cache=False,
    ):
        length = ops.shape(embedded)[1]
        start = 0 if cache is None else cache_index
        x = self._embed_positions(embedded, start, training)

        if cache is None:
            self_mask = causal_mask(length, length)[None]  # (1, T, T)
            if target_padding_mask is not None:
                self_mask = ops.logical_and(self_mask, target_padding_mask[:, None, :])
        elif grow_cache and isinstance(length, int) and length == 1:
            self_mask = None  # one new position, which may attend to every one before
        else:
            cache_length = ops.shape(cache["self"][0][0])[2] + (length if grow_cache else 0)
            self_mask = causal_mask(length, cache_length, cache_index)[None]  # (1, T, L)

        all_weights, new_self_cache = [], []
        for i, layer in enumerate(self.stack):
            if cache is None:
                x, weights = layer(
                    x, encoder_output, self_attention_mask=self_mask,
                    cross_attention_mask=source_padding_mask, return_attention_scores=True,
                    training=training,
                )
            else:
                x, weights, layer_cache = layer(
                    x, encoder_output, self_attention_mask=self_mask,
                    cross_attention_mask=source_padding_mask, self_cache=cache["self"][i],
                    cross_cache=cache["cross"][i], cache_index=cache_index,
                    return_attention_scores=True, training=training, grow_cache=grow_cache,
                    fused_weights=cache["fused"][i] if "fused" in cache else None,
                )
                new_self_cache.append(layer_cache)
            all_weights.append(weights)
        x = self._finish(x)

        results = (x,)
        if return_attention_scores:
            results += (all_weights,)
        if cache is not None:
            results += ({**cache, "self": tuple(new_self_cache)},)
        return results[0] if len(results) == 1 else results
