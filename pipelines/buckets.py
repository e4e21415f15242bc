"""The one bucketing rule and the one padder of every input path, in plain numpy (no TensorFlow).

The prepared data's batch plan (`pipelines.prepared.plan`), the dev batches and the tf.data
step `pipelines.batching.bucket_by_length` all cut and pad with these functions, so the same
lengths give the same batches of the same shapes whichever path reads them:

    bounds = geometric_boundaries(max_length)        # 8, 9, ..., max_length
    order, starts = cut(src_len, tgt_len, bounds, tokens_per_batch)
    for rows in np.split(order, starts[1:]):         # one batch
        shape = batch_shape(src_len[rows].max(), tgt_len[rows].max(), len(rows), bounds,
                            tokens_per_batch)
        source = pad(src_ids, src_offsets, src_len, rows, shape[0], shape[1])

The rule: pairs are sorted by their length cell (the larger of the two sides' cells, then the
target's, the source's, then the exact lengths) and cut greedily, a new batch starting when one
more pair would take either side over `tokens_per_batch` tokens, padding included. Lengths count
the specials (source + EOS; BOS + target + EOS).
"""

import numpy as np

from pipelines.defaults import GROWTH, MAX_LENGTH, MIN_BOUNDARY, STATIC_MIN_WIDTH
from pipelines.special_ids import PAD_ID


def geometric_boundaries(max_length=MAX_LENGTH, min_boundary=MIN_BOUNDARY, growth=GROWTH):
    """Bucket upper bounds: min_boundary, then each about `growth` times the last (at least +1),
    the last one equal to max_length."""
    if growth <= 1.0:
        raise ValueError(f"growth={growth} must be larger than 1.")
    bounds = [min(min_boundary, max_length)]
    while bounds[-1] < max_length:
        bounds.append(min(max_length, max(bounds[-1] + 1, int(bounds[-1] * growth))))
    return bounds


def static_boundaries(max_length=MAX_LENGTH, min_width=STATIC_MIN_WIDTH):
    """The coarse cells of static shapes: 2**k and 3 * 2**(k - 1) from `min_width` (8, 12, 16,
    24, 32, 48, ...), the last one equal to max_length. Fewer cells than `geometric_boundaries`
    (so fewer compiled steps), at the price of more padding: a width is at most 1.5 times the
    one below it."""
    bounds, width = [], min_width
    while width < max_length:
        bounds.append(width)
        width = width * 3 // 2 if width & (width - 1) == 0 else width * 4 // 3
    return bounds + [max_length]


def check_budget(tokens_per_batch, max_length):
    """Raises ValueError when a batch of `tokens_per_batch` cannot hold one longest pair."""
    if tokens_per_batch < max_length:
        raise ValueError(f"tokens_per_batch={tokens_per_batch} cannot hold one pair of "
                         f"max_length={max_length}; raise the budget or lower max_length.")


def cut(src_len, tgt_len, bounds, tokens_per_batch, pad_to_bucket=False):
    """Sorts pairs by length cell and cuts them greedily into token-budget batches.

    Args:
        src_len, tgt_len: lengths with specials (integer arrays).
        bounds: `geometric_boundaries`.
        tokens_per_batch: the budget per side, padding included.
        pad_to_bucket: budget the bucket boundaries rather than the exact lengths.

    Returns:
        (order, starts): pair indices in batch order, and where each batch starts in `order`
        (int64). The number of batches depends only on the multiset of lengths, not on their
        order.
    """
    src_len, tgt_len = np.asarray(src_len, np.int64), np.asarray(tgt_len, np.int64)
    bounds = np.asarray(bounds, np.int64)
    buckets, top = len(bounds), int(bounds[-1]) + 1
    src_bucket = np.searchsorted(bounds, src_len, side="left")
    tgt_bucket = np.searchsorted(bounds, tgt_len, side="left")
    key = np.maximum(src_bucket, tgt_bucket)
    for part, size in ((tgt_bucket, buckets), (src_bucket, buckets), (tgt_len, top),
                       (src_len, top)):
        key = key * size + part
    order = np.argsort(key, kind="stable")
    if pad_to_bucket:
        cap_src, cap_tgt = bounds[src_bucket[order]], bounds[tgt_bucket[order]]
    else:
        cap_src, cap_tgt = src_len[order], tgt_len[order]
    starts = [0]
    count = longest_src = longest_tgt = 0
    for i, (s, t) in enumerate(zip(cap_src.tolist(), cap_tgt.tolist())):
        new_src = s if s > longest_src else longest_src
        new_tgt = t if t > longest_tgt else longest_tgt
        if count and (count + 1) * max(new_src, new_tgt) > tokens_per_batch:
            starts.append(i)
            count, longest_src, longest_tgt = 1, s, t
        else:
            count, longest_src, longest_tgt = count + 1, new_src, new_tgt
    return order, np.asarray(starts if len(order) else [], np.int64)


def _bound(bounds, length):
    """The cell boundary at or above `length` (the length itself above the last boundary)."""
    cell = min(int(np.searchsorted(bounds, length)), len(bounds) - 1)
    return max(int(bounds[cell]), int(length))


def batch_shape(longest_src, longest_tgt, count, bounds, tokens_per_batch,
                pad_to_bucket=False):
    """(rows, source width, target width) of a batch of `count` pairs whose longest sides are
    `longest_src`, `longest_tgt` (with specials): their own lengths, or with `pad_to_bucket` the
    cell boundaries, and the rows filled to what the budget allows at that width (a small fixed
    set of shapes, for XLA)."""
    if not pad_to_bucket:
        return int(count), int(longest_src), int(longest_tgt)
    width_src, width_tgt = _bound(bounds, longest_src), _bound(bounds, longest_tgt)
    return max(tokens_per_batch // max(width_src, width_tgt), int(count)), width_src, width_tgt


def fixed_shape(shape, bounds, tokens_per_batch, devices=1):
    """A `batch_shape` made one of a few shapes, so that XLA compiles one step per length cell:
    both sides (source, decoder input, labels) to the cell boundary W at or above the longer
    of them, the rows to the most rows any batch of that cell can have (tokens_per_batch //
    (the boundary below W + 1)), rounded up to a multiple of the devices the batch is split
    over. Returns (rows, source width, target width), the target counting BOS and EOS (W + 1).

    `bounds` may be the cells the batches were cut by (`geometric_boundaries`), or coarser ones
    (`static_boundaries`: fewer shapes, more padding): the batches stay the same either way.
    """
    rows, width_src, width_tgt = shape
    longest = max(width_src, width_tgt - 1)
    cell = int(np.searchsorted(bounds, longest))
    width = int(bounds[cell]) if cell < len(bounds) else longest
    below = int(bounds[cell - 1]) if 0 < cell <= len(bounds) else 0
    rows = max(tokens_per_batch // (below + 1), rows)
    rows += -rows % devices
    return rows, width, width + 1


def pad(flat, offsets, lengths, rows, num_rows, width, before=None, after=None, columns=None):
    """The padder: sequences `rows` of `flat` (each at its offset, of its length), with a
    `before` / `after` special id around each when given, as the first `width` columns of an
    (num_rows, columns or width) int32 matrix padded with PAD_ID (rows past the sequences are
    all padding). An `after` that would fall at or past `width` is left out: a decoder input
    (BOS + target + EOS, one column narrower than the target) keeps no EOS of the longest
    targets."""
    rows = np.asarray(rows, np.int64)
    out = np.full((num_rows, columns or width), PAD_ID, np.int32)
    length = np.asarray(lengths)[rows].astype(np.int64)
    first = int(before is not None)
    places = np.arange(width - first)
    inside = places[None, :] < length[:, None]
    index = np.minimum(np.asarray(offsets)[rows][:, None].astype(np.int64) + places[None, :],
                       max(len(flat) - 1, 0))
    body = out[:len(rows), first:width]
    body[inside] = flat[index[inside]] if len(flat) else 0
    if before is not None:
        out[:len(rows), 0] = before
    if after is not None:
        end = length + first
        fits = end < width
        out[np.flatnonzero(fits), end[fits]] = after
    return out
