"""The best continuations of each sentence in a beam search step, without a pass of top-k over
all of them: an exact top-k in two stages.

A step chooses, per sentence, the 2K best of its K x V scores alive[k] + log_probs[k, v]. One
top-k over the (B, K x V) sums costs a pass to add them and a top-k that reads every one
(2.7 ms of a ~16 ms step for 64 sentences, K = 4, V = 8000; docs/performance.md). Here each
beam's row is cut into chunks of C tokens: the maximum of each chunk's log-probabilities (one
reduction), plus the beam's alive score, is the best sum in the chunk, since a float addition
of the same alive score keeps the order of what it is added to. The 2K chunks with the best
maxima hold the 2K best sums: a sum outside them is beaten by the maximum of each of those
2K chunks (or tied by one of a lower index, which top-k puts first). Those chunks, in the
order of their indices, are gathered, the alive scores added, and a top-k over their 2K x C
sums picks the same continuations, with the same values (the same additions) and in the same
order (ties to the lower index) as the one top-k over all of them.
"""

from keras import ops

from keras_transformer.decoding.search.rules import NEG_INF
from keras_transformer.layers import rows as on_rows

# Chunks of about this many tokens: fewer chunks to rank against fewer sums to gather; the
# step is flat from 32 to 160 (64 sentences, K = 4, V = 8000, amx class).
CHUNK = 64


def chunk_size(vocab):
    """The divisor of `vocab` (a Python int) in [CHUNK / 2, 2 CHUNK] nearest CHUNK that cuts
    a row into 4 chunks or more, or None (none such, e.g. a tiny vocabulary: the one top-k is
    used). With 2 or more chunks a row, K beams have the 2K chunks a step ranks."""
    divisors = [c for c in range(CHUNK // 2, 2 * CHUNK + 1) if vocab % c == 0
                and vocab // c >= 4]
    return min(divisors, key=lambda c: abs(c - CHUNK)) if divisors else None


def best_continuations(alive_log_probs, log_probs, count):
    """The `count` best of alive_log_probs[b, k] + log_probs[b, k, v] per sentence b.

    Args:
        alive_log_probs: (B, K) float32.
        log_probs: (B, K, V) float32 (V static).
        count: how many (2K in a step; a Python int or a scalar tensor) <= K x V.

    Returns:
        (values (B, count), indices (B, count) int32 into the flattened K x V): exactly
        `top_k(reshape(alive[:, :, None] + log_probs, (B, K * V)), count)`.
    """
    shape = ops.shape(log_probs)
    rows, beams, vocab = shape[0], shape[1], log_probs.shape[-1]
    size = None if vocab is None else chunk_size(int(vocab))
    if size is None:
        return ops.top_k(ops.reshape(alive_log_probs[:, :, None] + log_probs, (rows, -1)),
                         k=count)
    per_row = vocab // size
    chunks = ops.reshape(log_probs, (rows, beams * per_row, size))
    maxima = ops.reshape(ops.max(chunks, axis=-1), (rows, beams, per_row))
    return _in_best_chunks(alive_log_probs, maxima, count, size,
                           lambda chosen: gather_beams(chunks, chosen))


def _in_best_chunks(alive_log_probs, maxima, count, size, read):
    """The second stage: the 2K chunks of the best maxima ((B, K, per_row), each beam's
    chunks' before its alive score), read (`read(chosen)`: (B, N) chunk indices -> (B, N, C)
    log-probabilities) in index order, their sums' top-k. Returns (values, indices)."""
    shape = ops.shape(maxima)
    rows, beams, per_row = shape[0], shape[1], shape[2]
    best = maxima + alive_log_probs[:, :, None]
    _, chosen = ops.top_k(ops.reshape(best, (rows, beams * per_row)), k=count)
    chosen = ops.sort(chosen, axis=-1)  # in index order: ties go to the lower index
    sums = read(chosen) + gather_beams(alive_log_probs, chosen // per_row)[:, :, None]
    values, position = ops.top_k(ops.reshape(sums, (rows, -1)), k=count)
    return values, gather_beams(chosen, position // size) * size + position % size


def best_continuations_without(alive_log_probs, log_probs, count, token):
    """`best_continuations` with one token left out, and each beam's best token but it, in the
    passes of the plain one: (values, indices, best), exactly

        masked = where(arange(V) == token, NEG_INF, log_probs)
        best_continuations(alive_log_probs, masked, count), argmax(masked, axis=2)

    without writing `masked` (a pass over the (B, K, V) log-probabilities) nor reading it
    again for the argmax (another): only the chunk that holds `token` is masked, and a beam's
    best is found in its best chunk (the first of the highest maximum, then its first token of
    that value: the argmax's first index). A search with constraints leaves EOS to its own
    candidates (`constraints.ConstraintBanks.expand`). token: a Python int < V."""
    shape = ops.shape(log_probs)
    rows, beams, vocab = shape[0], shape[1], log_probs.shape[-1]
    size = None if vocab is None else chunk_size(int(vocab))
    if size is None:
        masked = ops.where(ops.equal(ops.arange(vocab), token)[None, None, :], NEG_INF,
                           log_probs)
        values, indices = best_continuations(alive_log_probs, masked, count)
        return values, indices, ops.cast(ops.argmax(masked, axis=2), "int32")
    per_row, home, column = vocab // size, token // size, token % size
    chunks = ops.reshape(log_probs, (rows, beams, per_row, size))
    in_home = ops.equal(ops.arange(size), column)  # (C,): the token's place in its chunk
    home_max = ops.max(ops.where(in_home, NEG_INF, chunks[:, :, home]), axis=-1)  # (B, K)
    maxima = ops.where(ops.equal(ops.arange(per_row), home)[None, None, :], home_max[:, :, None],
                       ops.max(chunks, axis=-1))  # (B, K, per_row)
    chunks = ops.reshape(chunks, (rows, beams * per_row, size))

    def read(chosen):
        """The chunks `chosen` ((B, N) indices into the B x (K x per_row)), the token masked."""
        masked = ops.logical_and(ops.equal(chosen % per_row, home)[:, :, None], in_home)
        return ops.where(masked, NEG_INF, gather_beams(chunks, chosen))  # (B, N, C)

    first = ops.cast(ops.argmax(maxima, axis=2), "int32")  # (B, K): each beam's best chunk
    own = first + ops.arange(beams, dtype="int32")[None, :] * per_row
    best = first * size + ops.cast(ops.argmax(read(own), axis=2), "int32")
    return (*_in_best_chunks(alive_log_probs, maxima, count, size, read), best)


# tensor[b, indices[b, j]]: (B, N, ...) and (B, M) -> (B, M, ...), in one gather (TensorFlow's
# take_along_axis costs a dozen ops per call, and the search calls this several times a step).
gather_beams = on_rows.take_per_row
