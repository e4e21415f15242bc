"""Constrained beam search that keeps the sentence: the plain search first, then the constrained
one only where the plain translation lacks a phrase, its output about as long as the plain one.

A constrained search (`constraints.ConstraintBanks`) forces the phrases in, and shares the beam
among hypotheses that met more or fewer of them: where the plain translation already holds
every phrase, it may still lose it (the banks split the beam, and its best path is pruned)
and return a worse sentence. And a hypothesis that has not yet met its phrases may not end:
under a length penalty that rewards length (alpha above 1), one that placed a phrase badly
would rather go on writing than end, up to its limit (the input's length + 50).

So a beam search with constraints (`beam_search.translate_beam`) runs in two passes of the
one search body:

  1. the plain search (no constraints; the request's other options), as without constraints;
  2. the constrained search, for the sentences whose plain best lacks a phrase only (the
     others are done before it starts: a compact loop leaves them out, a static one masks
     them), each sentence's output limit the plain best's length + its phrases' tokens
     (+ `SLACK`; never above its own limit).

A sentence whose plain best already holds every phrase (contiguous ids, anywhere: `holds`)
keeps the plain search's hypotheses that hold them all; the other sentences get the
constrained search's that hold them (or its best alone, where none does: one forced to end at
its limit without them). The others are emptied (score NEG_INF): an n-best list may be
shorter than the beam. Everything in `keras.ops` with fixed ranks (tf.function, XLA, JAX).
"""

from keras import ops

from keras_transformer.decoding.search.constraints import phrase_lengths
from keras_transformer.decoding.search.rules import NEG_INF
from pipelines.special_ids import PAD_ID

# Tokens a constrained output may have beyond its plain translation's and its phrases' (on
# Multi30k val, the demo run: 0 gave the best sacreBLEU of -2, 0, 1, 2, 3 and 6; the more
# room, the more a badly placed phrase is followed by more words: docs/decoding.md).
SLACK = 0
# A plain output longer than this many times its source stutters (on Multi30k a German output
# holds about 1.2 times the English source's tokens): the constrained one need not follow it.
LENGTH_RATIO = 2


def holds(ids, constraints):
    """(B, H) bool: hypothesis h of sentence b holds every phrase of b as a contiguous run of
    ids. ids: (B, H, T) int32, 0-padded; constraints: (B, C, L) int32, 0-padded (a row of
    zeros is no phrase)."""
    ids, phrases = ops.cast(ids, "int32"), ops.cast(constraints, "int32")
    length, width = ops.shape(ids)[2], ops.shape(phrases)[2]
    padded = ops.pad(ids, [[0, 0], [0, 0], [0, width]])  # a window may start anywhere
    windows = ops.take(padded, ops.arange(length)[:, None] + ops.arange(width)[None, :],
                       axis=2)  # (B, H, T, L)
    padding = ops.equal(phrases, PAD_ID)[:, None, :, None, :]  # (B, 1, C, 1, L)
    same = ops.logical_or(ops.equal(windows[:, :, None], phrases[:, None, :, None, :]),
                          padding)  # (B, H, C, T, L)
    found = ops.any(ops.all(same, axis=4), axis=3)  # (B, H, C)
    no_phrase = ops.all(padding, axis=(3, 4))  # (B, 1, C)
    return ops.all(ops.logical_or(found, no_phrase), axis=2)


def output_lengths(ids):
    """(B, H, T) ids, 0-padded -> (B, H) int32 tokens of each hypothesis (EOS included)."""
    return ops.sum(ops.cast(ops.not_equal(ids, PAD_ID), "int32"), axis=2)


def tighter_limits(limits, plain_ids, constraints, source_lengths):
    """The constrained search's limits: at most the plain best's length (EOS included), or
    `LENGTH_RATIO` times the source's (`source_lengths`, (B,), EOS included) where that is
    shorter (a plain output that stutters on), plus the phrases' tokens and `SLACK`. limits:
    (B,) the constrained search's own."""
    plain = ops.minimum(output_lengths(plain_ids[:, :1])[:, 0],
                        LENGTH_RATIO * ops.cast(source_lengths, "int32"))
    bound = plain + ops.sum(phrase_lengths(ops.cast(constraints, "int32")), axis=1) + SLACK
    return ops.minimum(limits, bound)


def _widest(a, b):
    """max(a, b) of two lengths: Python ints where static, else a scalar tensor."""
    return max(a, b) if isinstance(a, int) and isinstance(b, int) else ops.maximum(a, b)


def _fit(ids, width):
    """(B, H, T) -> (B, H, width), width >= T: padded with 0."""
    return ops.pad(ids, [[0, 0], [0, 0], [0, width - ops.shape(ids)[2]]])


def merged(plain, constrained, kept):
    """The result: `plain`'s hypotheses that hold every phrase for the sentences `kept` ((B,)
    bool, whose plain best holds them), `constrained`'s for the others, those that hold them
    (a hypothesis forced to end at its limit without them ranks last: it is left out unless
    it is the best, so that there is always an output). Each a `beam_search` dict with
    "holding" ((B, H) bool), added by `plain_first`."""
    width = _widest(ops.shape(plain["ids"])[2], ops.shape(constrained["ids"])[2])
    best = ops.equal(ops.arange(ops.shape(plain["holding"])[1]), 0)[None, :]  # (1, H)
    holding = ops.where(kept[:, None], plain["holding"],
                        ops.logical_or(constrained["holding"], best))
    ids = ops.where(kept[:, None, None], _fit(plain["ids"], width),
                    _fit(constrained["ids"], width))
    result = {"ids": ops.where(holding[:, :, None], ids, 0)}
    for key in ("scores", "log_probs"):
        result[key] = ops.where(holding, ops.where(kept[:, None], plain[key], constrained[key]),
                                NEG_INF)
    return result


def plain_first(search, constraints, source_lengths):
    """A beam search with constraints in two passes (the module docstring). `search(phrases,
    done=None, limits=None)` runs the one beam search body without (`phrases` None) or with
    constraints, the sentences `done` ((B,) bool) left out, `limits` a function of the
    search's own (B,) limits that gives those it uses; it returns the `beam_search` dict.
    source_lengths: (B,) the sources' tokens (EOS included)."""
    plain = search(None)
    plain["holding"] = holds(plain["ids"], constraints)
    kept = plain["holding"][:, 0]
    constrained = search(constraints, done=kept,
                         limits=lambda own: tighter_limits(own, plain["ids"], constraints,
                                                           source_lengths))
    constrained["holding"] = holds(constrained["ids"], constraints)
    return merged(plain, constrained, kept)
