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
    best = ops.reshape(ops.max(chunks, axis=-1), (rows, beams, per_row)) \
        + alive_log_probs[:, :, None]
    _, chosen = ops.top_k(ops.reshape(best, (rows, beams * per_row)), k=count)
    chosen = ops.sort(chosen, axis=-1)  # in index order: ties go to the lower index
    sums = gather_beams(chunks, chosen) + gather_beams(alive_log_probs, chosen // per_row)[
        :, :, None]  # (B, count, C)
    values, position = ops.top_k(ops.reshape(sums, (rows, -1)), k=count)
    return values, gather_beams(chosen, position // size) * size + position % size


# tensor[b, indices[b, j]]: (B, N, ...) and (B, M) -> (B, M, ...), in one gather (TensorFlow's
# take_along_axis costs a dozen ops per call, and the search calls this several times a step).
gather_beams = on_rows.take_per_row
