"""The bridge from a `Transformer` (or an `Ensemble`) to the search loops: the step function,
its state and each sentence's output limit.

Search is separate from the model. The loops, `search.greedy_search` and
`beam_search.beam_search`, take a step function

    step_fn(tokens (N, 1), state, index) -> (logits (N, 1, V), state)

and a `state` (nested tensors with N = batch x beam rows) that beam search reorders as beams
are chosen. `model_step(model, source_ids, beam_size)` builds that function from the model's
`encode` / `init_cache` / `decode_step`: the self-attention caches are the reordered state, while
the encoder-decoder keys/values are computed once per sentence, live in the step function's
closure and are never reordered.

The limits: on TensorFlow the output buffer holds max(limits) positions and the self-attention
caches grow by one position per step (shapes that follow the values: a step attends over, and
beam search reorders, the positions written so far); where every shape is static (XLA, JAX; a
body's `static=True`) the caches and buffers hold `static_max_length` positions (padded source
width + extra_length) while each sentence's limit stays exact (a value).
"""

from keras import ops

from keras_transformer.decoding.search.compiling import dynamic_shapes
from keras_transformer.decoding.search.constraints import constraint_limits
from keras_transformer.decoding.search.modes import LoopShape
from keras_transformer.decoding.search.rules import prefix_limits
from keras_transformer.decoding.request import DEFAULTS
from pipelines.special_ids import PAD_ID

EXTRA_LENGTH = DEFAULTS["extra_length"]  # paper: maximum output length = input length + 50
# What the step reads once per sentence (a compact loop drops it with the sentence).
PER_SENTENCE = ("cross", "source_mask")


def output_limits(source_ids, extra_length=EXTRA_LENGTH):
    """Per-sentence maximum output length (EOS included): real source length + extra_length."""
    source_lengths = ops.sum(ops.cast(ops.not_equal(source_ids, PAD_ID), "int32"), axis=1)
    return source_lengths + extra_length


def static_max_length(source_ids, extra_length=EXTRA_LENGTH):
    """The output length bound a compiler can fix: padded source width + extra_length.

    XLA (TensorFlow's jit_compile, JAX) needs every shape inside the search (caches, output
    buffers) known when it compiles, which it does once per input shape; the per-sentence
    limits stay exact (they are values).
    """
    return ops.shape(source_ids)[1] + extra_length


def tile_beams(tensor, beam_size):
    """(B, ...) -> (B * beam_size, ...), each row repeated beam_size times."""
    return ops.repeat(tensor, beam_size, axis=0)


def encode(model, source_ids):
    """What `model_step` computes first: (encoder output, source mask) of `source_ids`, or, for
    an `Ensemble`, the tuple of its members'. A search that branches (`rules.
    with_optional_prefix`) computes it once, before its branches, rather than once in each."""
    members = getattr(model, "members", None)
    if members is not None:
        return tuple(member.encode(source_ids) for member in members)
    return model.encode(source_ids)


def model_step(model, source_ids, beam_size=1, max_length=None, cached=True, limits=None,
               extra_length=EXTRA_LENGTH, grow=None, shape=LoopShape, encoded=None):
    """Step function, initial state and limits for searching `model` on `source_ids`.

    Args:
        model: a `Transformer`, or an `Ensemble` of them (its state is the tuple of the
            members' states; each step gives the log of their mean probabilities).
        source_ids: (B, S) int32, padded with 0.
        beam_size: rows per sentence (the encoder and the cross-attention keys and values
            run once per sentence; its beams share them, `Transformer.init_cache`).
        max_length: cache length; default max(limits) on TensorFlow (the output buffer's;
            the caches grow there), `static_max_length` on backends that compile static
            shapes (pass it with your own `limits` there).
        cached: False recomputes the whole decoder over the prefix at every step (slow; a
            reference to test the cache against).
        limits: (B,) maximum output lengths (default: source length + extra_length).
        extra_length: 50 in the paper's translation setting, 300 for parsing.
        grow: self-attention caches that grow by a position per step (`Transformer.init_cache`)
            rather than hold max_length; default: where shapes may follow values (TensorFlow)
            and max_length is not given.
        shape: the search's loop shape (`modes.LoopShape` or a subclass), which says how the
            state is held (`LoopShape.step_state`): the self-attention caches (B x beam_size
            rows) alone, or with what the step reads once per sentence (the cross-attention's
            keys and values, the source mask; B rows) for a loop that drops done sentences
            (`compact.CompactLoop`, which needs `cached`).
        encoded: `encode(model, source_ids)`, where the caller computed it already.

    Returns:
        (step_fn, state, limits (B,), max_length).
    """
    if limits is None:
        limits = output_limits(source_ids, extra_length)
    if grow is None:
        grow = max_length is None and dynamic_shapes()
    if max_length is None:
        max_length = (ops.max(limits, initial=1) if dynamic_shapes()
                      else static_max_length(source_ids, extra_length))
    step_fn, rows, sentences = _split_step(model, source_ids, beam_size, max_length, cached,
                                           limits, grow, encoded)
    return (*shape.step_state(step_fn, rows, sentences), limits, max_length)


def _split_step(model, source_ids, beam_size, max_length, cached, limits, grow, encoded):
    """`model_step`'s step over the pair (rows, sentences): (step_fn, rows, sentences), the
    sentences None where the step reads nothing once per sentence (not `cached`)."""
    members = getattr(model, "members", None)  # an `Ensemble`
    if members is not None:
        return _ensemble_step(members, source_ids, beam_size, max_length, cached, limits, grow,
                              encoded)
    encoder_output, source_mask = encoded if encoded is not None else model.encode(source_ids)
    if not cached:
        return _uncached_step(model, encoder_output, source_mask, beam_size, max_length)
    # The beams of a sentence share its cross-attention keys and values. A growing cache
    # starts empty with a length of no static value (a reduction's).
    length = ops.max(limits, initial=1) if grow else max_length
    cache = model.init_cache(encoder_output, source_mask, length, beam_size, grow)
    fixed = {name: value for name, value in cache.items()
             if name != "self" and name not in PER_SENTENCE}

    def step_fn(tokens, state, index):
        rows, sentences = state
        logits, cache = model.decode_step(tokens, dict(fixed, self=rows, **sentences), index)
        return logits, (cache["self"], sentences)

    return step_fn, cache["self"], {name: cache[name] for name in PER_SENTENCE}


def _uncached_step(model, encoder_output, source_mask, beam_size, max_length):
    """`_split_step` without the cache: the whole decoder over the tokens so far, every step
    (its state the (B x beam_size, max_length) tokens; nothing per sentence)."""
    encoder_output = tile_beams(encoder_output, beam_size)
    source_mask = tile_beams(source_mask, beam_size)
    prefix = ops.zeros((ops.shape(encoder_output)[0], max_length), "int32")

    def step_fn(tokens, state, index):
        prefix = ops.slice_update(state[0], (0, index), ops.cast(tokens, "int32"))
        # The whole buffer (a static shape): the causal mask hides the positions after index.
        logits = model.decode(prefix, encoder_output, source_mask)
        return ops.expand_dims(ops.take(logits, index, axis=1), 1), (prefix, None)

    return step_fn, prefix, None


def _ensemble_step(members, source_ids, beam_size, max_length, cached, limits, grow,
                   encoded=None):
    """`_split_step` for an `Ensemble`: the rows and the sentences are the tuples of the
    members' (None without the cache); the step returns the log of the members' mean
    next-token probabilities (as logits: a log-softmax of them gives them back)."""
    from keras_transformer.models.ensemble import mean_of_probabilities

    encoded = encoded if encoded is not None else (None,) * len(members)
    steps = [_split_step(member, source_ids, beam_size, max_length, cached, limits, grow,
                         member_encoded) for member, member_encoded in zip(members, encoded)]

    def step_fn(tokens, state, index):
        rows, sentences = state
        pairs = zip(rows, (None,) * len(rows) if sentences is None else sentences)
        outputs = [fn(tokens, pair, index) for (fn, _, _), pair in zip(steps, pairs)]
        return (mean_of_probabilities([logits for logits, _ in outputs]),
                tuple(zip(*(pair for _, pair in outputs))))

    rows, sentences = (tuple(part) for part in zip(*(step[1:] for step in steps)))
    return step_fn, rows, None if None in sentences else sentences


def prefixed_step(model, source_ids, rows_per_sentence, static, prefix=None, cached=True,
                  extra_length=EXTRA_LENGTH, max_output_length=None, constraints=None,
                  shape=LoopShape, encoded=None):
    """`model_step` for a search of `rows_per_sentence` rows per sentence (beams or samples)
    whose outputs may start with a prefix ((B, P) ids) and must contain constraint phrases
    ((B, C, L) ids, beam search): the limits leave room for the prefix and EOS after it,
    and for the phrases (their total length more), and with `static` (or a Python int
    `max_output_length`: every output's limit) the buffers hold a static bound, P (and
    C x L) more positions with a prefix (constraints). `shape`, `encoded`: as for
    `model_step`."""
    if max_output_length is None:
        limits = output_limits(source_ids, extra_length)
        bound = static_max_length(source_ids, extra_length) if static else None
    else:
        limits = ops.full((ops.shape(source_ids)[0],), max_output_length, "int32")
        bound = max_output_length
    limits = constraint_limits(prefix_limits(limits, prefix), constraints)
    if bound is not None and prefix is not None:
        bound += ops.shape(prefix)[1]
    if bound is not None and constraints is not None:
        bound += ops.shape(constraints)[1] * ops.shape(constraints)[2]
    return model_step(model, source_ids, rows_per_sentence, bound, cached=cached,
                      limits=limits, extra_length=extra_length,
                      grow=not static and dynamic_shapes(), shape=shape, encoded=encoded)
