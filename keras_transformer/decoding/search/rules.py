"""The rules every mode's search body shares, written once: which tokens may be chosen
(`mask_special_tokens`, `NEG_INF`), target prefixes (the tokens forced at each step, the limits
that leave room for them, the branch without them) and a result as the callers get it (the
exports' empty-row rule, the padding columns trimmed).

The bodies (`search.translate_greedy`, `beam_search.translate_beam`,
`sampling.translate_sample`) apply them; callers outside `decoding/` run the bodies, not these.
"""

import numpy as np
from keras import ops

from pipelines.special_ids import BOS_ID, EOS_ID, PAD_ID

NEG_INF = -1e9  # the log-probability of what may not be chosen


def special_tokens_banned(vocab, index, min_length=None):
    """(vocab,) bool: the tokens that may not follow at step `index`: PAD and BOS never, EOS
    not before position min_length - 1 if given."""
    ids = ops.arange(vocab)
    banned = ops.logical_or(ops.equal(ids, PAD_ID), ops.equal(ids, BOS_ID))
    if min_length is not None:
        banned = ops.logical_or(banned, ops.logical_and(ops.equal(ids, EOS_ID),
                                                        index + 1 < min_length))
    return banned


def mask_special_tokens(log_probs, index, min_length=None):
    """log_probs (..., V) with NEG_INF where `special_tokens_banned`."""
    return ops.where(special_tokens_banned(ops.shape(log_probs)[-1], index, min_length),
                     NEG_INF, log_probs)


def prefix_lengths(prefix):
    """(N, P) 0-padded prefix ids -> (N,) int32 numbers of tokens."""
    return ops.sum(ops.cast(ops.not_equal(prefix, PAD_ID), "int32"), axis=1)


def prefix_limits(limits, prefix):
    """Output limits that leave room for the prefix and EOS after it: max(limit, P_i + 1)."""
    return limits if prefix is None else ops.maximum(limits, prefix_lengths(prefix) + 1)


def prefix_forcing(prefix):
    """None without a prefix; else index -> (forced (N,) bool, token (N,) int32): whether
    row i's token at step index is its prefix's, and which."""
    if prefix is None:
        return None
    # A column of padding at the end: a prefix of width 0 (every row empty) still has a
    # column to read, and past a row's prefix the read is padding.
    prefix = ops.cast(prefix, "int32")
    prefix = ops.concatenate([prefix, ops.zeros((ops.shape(prefix)[0], 1), "int32")], axis=1)
    lengths = prefix_lengths(prefix)
    width = ops.shape(prefix)[1]

    def forced_token(index):
        column = ops.minimum(index, width - 1)
        token = ops.take(prefix, ops.expand_dims(column, 0), axis=1)[:, 0]
        return index < lengths, token

    return forced_token


def trim(ids):
    """Drops the all-padding columns at the end of (..., T) ids.

    The result's shape depends on the values: call it in a TensorFlow graph or on numpy
    arrays (the host side of a JAX search), never inside a compiled JAX function.
    """
    leading = tuple(range(len(ids.shape) - 1))
    if isinstance(ids, np.ndarray):
        used = np.flatnonzero(np.any(ids != PAD_ID, axis=leading))
        return ids[..., : (used[-1] + 1 if used.size else 0)]
    used = ops.any(ops.not_equal(ids, PAD_ID), axis=leading)  # (T,)
    length = ops.max(ops.where(used, ops.arange(1, ops.shape(ids)[-1] + 1), 0), initial=0)
    return ids[..., :length]


def with_optional_prefix(search, prefix):
    """`search(prefix)`, or, when no row of the prefix (B, P) holds a token, `search(None)`: the
    search without the per-step prefix masking (a request without prefixes, in a TensorFlow
    graph; a static search runs the masked one alone, which finds the same)."""
    return ops.cond(ops.any(ops.not_equal(prefix, PAD_ID)), lambda: search(prefix),
                    lambda: search(None))


def finish(result, empty_rows=None, trim_ids=True):
    """A body's result as its callers get it: the empty-row rule applied (`eos_for_empty_rows`)
    and the ids trimmed of their padding columns (never inside a static search: its callers
    trim outside the compiled function)."""
    if empty_rows is not None:
        result = eos_for_empty_rows(result, empty_rows)
    if trim_ids:
        result = {**result, "ids": trim(result["ids"])}
    return result


def eos_for_empty_rows(result, empty_rows):
    """The exports' rule for empty inputs on a result in the n-best layout: an empty row's
    first hypothesis is EOS alone with score 0, its others hold no tokens with score NEG_INF
    (every other score of the result, e.g. "log_probs", follows "scores"). The ids keep at
    least one column, so that every row can end with EOS."""
    ids = result["ids"]
    shape = ops.shape(ids)
    width = shape[2]
    if not isinstance(width, int):  # a value (TensorFlow graph): at least one column
        ids = ops.pad(ids, [[0, 0], [0, 0], [0, ops.maximum(0, 1 - width)]])
        width = ops.maximum(width, 1)
    elif width < 1:
        ids = ops.pad(ids, [[0, 0], [0, 0], [0, 1 - width]])
        width = 1
    first = ops.equal(ops.arange(shape[1]), 0)[None, :]  # (1, H)
    eos_only = ops.equal(ops.arange(width), 0)[None, None, :]
    replaced = ops.where(ops.logical_and(first[:, :, None], eos_only), EOS_ID, PAD_ID)
    empty = empty_rows[:, None]
    finished = {key: ops.where(empty, ops.where(first, 0.0, NEG_INF), scores)
                for key, scores in result.items() if key != "ids"}
    return {**finished, "ids": ops.where(empty[:, :, None], replaced, ids)}
