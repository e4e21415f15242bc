"""The Transformer encoder-decoder as a Keras model (paper Section 3, Figure 1)."""

import keras
from keras import ops

from keras_transformer.layers import Decoder, Encoder, ScaledEmbedding
from keras_transformer.dimensions import check_dimensions
from keras_transformer.models.presets import get_preset
from pipelines.special_ids import PAD_ID


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """Encoder-decoder Transformer: (source ids, target input ids) -> next-token logits.

    Id 0 is padding: masks are derived from it, so batches may be padded freely.
    Logits are float32 whatever the dtype policy.

    Args:
        vocab_size: size of the (shared) vocabulary; with `target_vocab_size`, the source
            vocabulary.
        target_vocab_size: separate target vocabulary size (None: one vocabulary shared by
            source, target and the output projection, as in the paper).
        tie_output: with separate vocabularies, reuse the target embedding as the output
            projection (default) or learn a separate one.
        num_layers, d_model, num_heads, d_ff, key_dim, value_dim, dropout: the paper's sizes
            (Table 3 names). key_dim and value_dim default to d_model / num_heads.
        attention_dropout: dropout on attention weights (paper: 0.0).
        activation: FFN activation (paper: "relu").
        norm_first: pre-norm residual blocks instead of the paper's post-norm.
        layer_norm_epsilon: LayerNorm epsilon.
        positional: "sinusoidal" (paper) or "learned" (Table 3 row E).
        max_length: positions of the learned positional embeddings.

    Call arguments:
        inputs: (source_ids (B, S), target_input_ids (B, T)), or a dict with keys
            "source_ids" and "target_ids".
        training: whether dropout is active.

    Returns:
        logits (B, T, target vocabulary), float32.

    Example:

        model = Transformer.from_preset("base", vocab_size=37000)
        model.compile(optimizer="adam", loss=LabelSmoothedCrossEntropy(0.1))
        model.fit(dataset)  # yields ((source_ids, target_input_ids), target_output_ids)
    """

    def __init__(
        self, vocab_size, target_vocab_size=None, tie_output=True, num_layers=6, d_model=512,
        num_heads=8, d_ff=2048, key_dim=None, value_dim=None, dropout=0.1,
        attention_dropout=0.0, activation="relu", norm_first=False, layer_norm_epsilon=1e-6,
        positional="sinusoidal", max_length=None, **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (("vocab_size", vocab_size), ("d_ff", d_ff)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive integer.")
        if target_vocab_size is not None and (
            not isinstance(target_vocab_size, int) or target_vocab_size <= 0
        ):
            raise ValueError(f"target_vocab_size={target_vocab_size!r} must be a positive integer.")
        key_dim, value_dim = check_dimensions(d_model, num_heads, key_dim, value_dim)
        self.vocab_size = vocab_size
        self.target_vocab_size = target_vocab_size
        self.tie_output = tie_output
        self.architecture = dict(
            num_layers=num_layers, d_model=d_model, num_heads=num_heads, d_ff=d_ff,
            key_dim=key_dim, value_dim=value_dim, dropout=dropout,
            attention_dropout=attention_dropout, activation=activation, norm_first=norm_first,
            layer_norm_epsilon=layer_norm_epsilon, positional=positional, max_length=max_length,
        )
        self.d_model = d_model
        policy = self.dtype_policy

        self.source_embedding = ScaledEmbedding(
            vocab_size, d_model, dtype=policy, name="token_embedding"
        )
        if target_vocab_size is None:
            self.target_embedding = self.source_embedding
        else:
            self.target_embedding = ScaledEmbedding(
                target_vocab_size, d_model, dtype=policy, name="target_embedding"
            )
        self.output_projection = None
        if target_vocab_size is not None and not tie_output:
            self.output_projection = keras.layers.Dense(
                target_vocab_size, use_bias=False, dtype=policy, name="output_projection"
            )
        self.encoder = Encoder(**self.architecture, dtype=policy, name="encoder")
        self.decoder = Decoder(**self.architecture, dtype=policy, name="decoder")

    @classmethod
    def from_preset(cls, name, vocab_size, **overrides):
        """Builds preset `name` (see `keras_transformer.presets`) with a vocabulary size.

        Keyword overrides replace preset values, e.g. `dropout=0.0`.
        """
        return cls(vocab_size=vocab_size, **{**get_preset(name)["model"], **overrides})

    def build(self, input_shape=None):
        hidden = (None, None, self.d_model)
        for embedding in {id(e): e for e in (self.source_embedding, self.target_embedding)}.values():
            embedding.build((None, None))
        self.encoder.build(hidden)
        self.decoder.build(hidden)
        if self.output_projection is not None:
            self.output_projection.build(hidden)
        self.built = True

    # -- pieces used by search -------------------------------------------------------------

    def encode(self, source_ids, return_attention_scores=False, training=False):
        """source_ids (B, S) -> (encoder output (B, S, d_model), source padding mask (B, S))."""
        source_mask = ops.not_equal(source_ids, PAD_ID)
        outputs = self.encoder(
            self.source_embedding(source_ids), padding_mask=source_mask,
            return_attention_scores=return_attention_scores, training=training,
        )
        if return_attention_scores:
            return outputs[0], source_mask, outputs[1]
        return outputs, source_mask

    def logits(self, decoder_output, step=False):
        """Pre-softmax projection (tied to the target embedding by default); float32.

        step: the output of one decoding step (few rows): the tied projection is then
        computed in the order that is fastest for few rows (`ScaledEmbedding.step_logits`).
        """
        if self.output_projection is not None:
            logits = self.output_projection(decoder_output)
        elif step:
            logits = self.target_embedding.step_logits(decoder_output)
        else:
            logits = self.target_embedding.logits(decoder_output)
        return ops.cast(logits, "float32")

    def decode(
        self, target_ids, encoder_output, source_mask, return_attention_scores=False,
        training=False,
    ):
        """Full (teacher-forced) decoder pass: target ids (B, T) -> logits (B, T, V)."""
        outputs = self.decoder(
            self.target_embedding(target_ids), encoder_output,
            target_padding_mask=ops.not_equal(target_ids, PAD_ID),
            source_padding_mask=source_mask,
            return_attention_scores=return_attention_scores, training=training,
        )
        if return_attention_scores:
            return self.logits(outputs[0]), outputs[1]
        return self.logits(outputs)

    def init_cache(self, encoder_output, source_mask, max_length, rows_per_sentence=1,
                   grow=False):
        """Decoding state for up to `max_length` target tokens, `rows_per_sentence` (R, the
        beams) decoder rows per sentence of `encoder_output` (B, S, d_model).

        Returns a dict: "self" (per-layer (keys, values), each (B x R, H, max_length, d),
        updated every step and reordered by beam search), "cross" (per-layer encoder-decoder
        keys and values, one row per sentence, computed here once), "source_mask" (B, S) and,
        with `grow`, "grow": True (self caches of no positions that each step extends, in
        TensorFlow's graphs; `Decoder.init_cache`).
        """
        cache = self.decoder.init_cache(encoder_output, max_length, rows_per_sentence, grow)
        cache["source_mask"] = source_mask
        return cache

    def decode_step(self, tokens, cache, index):
        """One incremental decoding step.

        Args:
            tokens: (B, T) ids at positions index .. index + T - 1 (usually T = 1).
            cache: from `init_cache` or a previous step.
            index: int scalar, position of `tokens[:, 0]`.

        Returns:
            (logits (B, T, V) float32, updated cache).
        """
        output, new_cache = self.decoder(
            self.target_embedding(tokens), None, source_padding_mask=cache["source_mask"],
            cache={name: cache[name] for name in ("self", "cross", "fused") if name in cache},
            cache_index=index,
            training=False, grow_cache=cache.get("grow", False),
        )
        new_cache["source_mask"] = cache["source_mask"]
        if cache.get("grow", False):
            new_cache["grow"] = True
        return self.logits(output, step=True), new_cache

    # -- keras.Model -----------------------------------------------------------------------

    def train_step(self, *args, **kwargs):
        # Keras' own step (its signature differs by backend: JAX's is stateless).
        logs = super().train_step(*args, **kwargs)
        if keras.backend.backend() != "tensorflow":
            return logs
        import tensorflow as tf

        strategy = getattr(self, "_distribute_strategy", None)
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            # Keras (3.15) averages the logs of a multi-worker step with
            # strategy.reduce("MEAN", value, axis=0), which rejects scalars: hand it (1,)
            # tensors, which that reduction turns back into scalars.
            logs = {name: ops.reshape(value, (1,)) for name, value in logs.items()}
        return logs

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        """Builds metrics and loss from a fixed (1, 1) sample under tf.distribute.

        Keras (3.15) otherwise averages the first distributed batch across replicas to get a
        sample, which fails when replicas hold token-budget batches of different shapes
        (`AddN ... must have the same size and shape`). Only shapes' ranks and dtypes matter
        for the symbolic build, so a tiny batch of the right structure does the job.
        """
        if getattr(self, "_distribute_strategy", None) is None:
            return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)
        ids = ops.ones((1, 1), "int32")
        with self.distribute_strategy.scope():
            self._symbolic_build(data_batch=((ids, ids), ids))

    def call(self, inputs, training=None):
        if isinstance(inputs, dict):
            source_ids, target_ids = inputs["source_ids"], inputs["target_ids"]
        else:
            source_ids, target_ids = inputs
        encoder_output, source_mask = self.encode(source_ids, training=training)
        return self.decode(target_ids, encoder_output, source_mask, training=training)

    def get_config(self):
        config = {
            "vocab_size": self.vocab_size,
            "target_vocab_size": self.target_vocab_size,
            "tie_output": self.tie_output,
            **self.architecture,
        }
        base = super().get_config()
        for key in ("name", "trainable", "dtype"):
            if key in base:
                config[key] = base[key]
        return config
