"""Scoring given translations: log P(Y | X) under the model, one teacher-forced decoder pass.

Used to filter or rerank parallel data and to compare systems on fixed outputs. The numbers
are the ones the search adds up: natural-log probabilities of the target's subword tokens and
of the EOS after them, normalized over the whole vocabulary (the search's scores without the
length penalty). An ensemble scores with the mean of its members' probabilities, as it
searches.

`score_ids` is this mode's one body; `Translator` (through `compiled_scorer`) and the
SavedModel's `score` signature run it.
"""

from keras import ops

from keras_transformer.decoding.search.compiling import compile_search
from pipelines.special_ids import BOS_ID, PAD_ID


def token_log_probs(model, source_ids, target_ids):
    """Per-token log-probabilities of the targets.

    Args:
        model: a `Transformer` or an `Ensemble`.
        source_ids: (B, S) int32, EOS-terminated, 0-padded.
        target_ids: (B, T) int32, EOS-terminated, 0-padded.

    Returns:
        (B, T) float32: log P(y_t | y_<t, X) where target_ids is not padding, 0 elsewhere.
    """
    target_ids = ops.cast(target_ids, "int32")
    batch = ops.shape(target_ids)[0]
    inputs = ops.concatenate(
        [ops.full((batch, 1), BOS_ID, "int32"), target_ids[:, :-1]], axis=1)
    members = getattr(model, "members", None)
    if members is None:
        log_probs = _log_softmax(_logits(model, source_ids, inputs))
    else:
        from keras_transformer.models.ensemble import mean_of_probabilities

        log_probs = _log_softmax(mean_of_probabilities(
            [_logits(member, source_ids, inputs) for member in members]))
    chosen = ops.take_along_axis(log_probs, ops.expand_dims(target_ids, -1), axis=-1)[..., 0]
    return ops.where(ops.equal(target_ids, PAD_ID), 0.0, chosen)


def _logits(model, source_ids, decoder_inputs):
    encoder_output, source_mask = model.encode(source_ids)
    return model.decode(decoder_inputs, encoder_output, source_mask)


def _log_softmax(logits):
    return ops.log_softmax(ops.cast(logits, "float32"), axis=-1)


def score_ids(model, source_ids, target_ids):
    """{"log_prob": (B,) total, "tokens": (B,) int32 target tokens with EOS} (a graph or
    eager function; `compiled_scorer` compiles it)."""
    per_token = token_log_probs(model, source_ids, target_ids)
    tokens = ops.sum(ops.cast(ops.not_equal(target_ids, PAD_ID), "int32"), axis=1)
    return {"log_prob": ops.sum(per_token, axis=1), "tokens": tokens}


def compiled_scorer(model, jit_compile=False):
    """`score_ids` compiled once (see `compiling.compile_search` for each backend): a function
    (source_ids (B, S), target_ids (B, T)) -> {"log_prob": (B,), "tokens": (B,)}."""

    def score(source_ids, static, target_ids):
        return score_ids(model, source_ids, target_ids)

    return compile_search(model, score, lambda outputs: outputs, jit_compile,
                          (((None, None), "int32"),))
