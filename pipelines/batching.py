"""tf.data steps from text pairs to training batches. Each is a factory returning
`Callable[[tf.data.Dataset], tf.data.Dataset]`, applied with `ds.apply(...)`:

    pairs.apply(tokenize_pairs(tokenizer))          # (src ids + EOS, BOS + tgt ids + EOS)
         .apply(filter_by_length(max_length))       # drop over-long pairs (never truncate)
         .shuffle(...)                              # seeded
         .apply(bucket_by_length(tokens_per_batch)) # token-budget batches, both sides
         .apply(shift_targets())                    # ((src, tgt_in), tgt_out)
         .prefetch(tf.data.AUTOTUNE)

`make_dataset` strings them together.

Bucketing (`bucket_by_length`): lengths are grouped by geometric boundaries (8, 9, ..., each
about `growth` times the last, up to max_length). Sentences are drawn into pools of `pool_size`,
sorted inside a pool by their (source bucket, target bucket) cell, and cut greedily into batches
that keep `batch_size x padded_length <= tokens_per_batch` on *each* side; the batches are then
shuffled. On Multi30k this wastes under 10% on padding with batches about 98% full (see
`benchmarks/pipeline.py`), where per-bucket `group_by_window` batching leaves many part-filled
buckets at the end of each pass.
"""

import logging

import numpy as np
import tensorflow as tf

from pipelines.buckets import geometric_boundaries  # noqa: F401  (re-exported)
from pipelines.special_ids import BOS_ID, EOS_ID, PAD_ID

log = logging.getLogger(__name__)


def tokenize_pairs(tokenizer, chunk=512):
    """(src text, tgt text) -> (src ids + [EOS], [BOS] + tgt ids + [EOS]), int32 vectors.

    Tokenizes `chunk` sentences at a time (much faster than one by one).
    """

    def tokenize(src, tgt):
        src_ids = tokenizer.tokenize(src)
        tgt_ids = tokenizer.tokenize(tgt)
        rows = tf.shape(src)[0:1]
        eos = tf.RaggedTensor.from_tensor(tf.fill(tf.concat([rows, [1]], 0), EOS_ID))
        bos = tf.RaggedTensor.from_tensor(tf.fill(tf.concat([rows, [1]], 0), BOS_ID))
        return tf.concat([src_ids, eos], axis=1), tf.concat([bos, tgt_ids, eos], axis=1)

    def apply(dataset):
        return (dataset.batch(chunk)
                .map(tokenize, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
                .unbatch())

    return apply


def filter_by_length(max_length):
    """Drops pairs whose source or target (with specials) is longer than `max_length` tokens.

    Nothing is truncated. `count_lengths` counts what this drops, for the log.
    """
    if max_length <= 2:
        raise ValueError(f"max_length={max_length} must be larger than 2 (BOS and EOS).")

    def apply(dataset):
        return dataset.filter(
            lambda src, tgt: tf.logical_and(tf.size(src) <= max_length, tf.size(tgt) <= max_length)
        )

    return apply


def count_lengths(tokenized, max_length, chunk=4096):
    """One pass over tokenized pairs: {"pairs", "too_long", "src_tokens", "tgt_tokens"}."""
    totals = dict(pairs=0, too_long=0, src_tokens=0, tgt_tokens=0)
    lengths = tokenized.map(lambda src, tgt: (tf.size(src), tf.size(tgt))).batch(chunk)
    for src_len, tgt_len in lengths.as_numpy_iterator():
        totals["pairs"] += len(src_len)
        totals["too_long"] += int(np.sum((src_len > max_length) | (tgt_len > max_length)))
        totals["src_tokens"] += int(src_len.sum())
        totals["tgt_tokens"] += int(tgt_len.sum())
    return totals


def bucket_by_length(tokens_per_batch, max_length=256, growth=1.1, min_boundary=8,
                     pad_to_bucket=False, pool_size=None, shuffle_buffer=256, seed=None):
    """Batches (src, tgt) id vectors so that each side holds at most `tokens_per_batch` tokens.

    Args:
        tokens_per_batch: budget per side, counting padding (paper: ~25000). Under
            tf.distribute this is per replica.
        max_length: longest pair allowed in (apply `filter_by_length` first).
        growth, min_boundary: the geometric bucket boundaries.
        pad_to_bucket: pad each batch's lengths up to their bucket boundary, and its batch
            size up to the capacity of that bucket (all-padding rows), so that shapes come
            from a small fixed set (for XLA).
        pool_size: sentences sorted together (default 8 x tokens_per_batch).
        shuffle_buffer: batches shuffled together after cutting (0: keep length order).
        seed: shuffle seed.

    Returns:
        a Dataset -> Dataset step yielding (src (B, S), tgt (B, T)) int32, padded with 0.
    """
    if tokens_per_batch < max_length:
        raise ValueError(
            f"tokens_per_batch={tokens_per_batch} cannot hold one pair of max_length="
            f"{max_length}; raise the budget or lower max_length."
        )
    bounds = tf.constant(geometric_boundaries(max_length, min_boundary, growth), tf.int64)
    pool_size = pool_size or 8 * tokens_per_batch
    budget = tf.constant(tokens_per_batch, tf.int64)
    num_buckets = int(bounds.shape[0])

    def cut(src, tgt):
        src_len, tgt_len = src.row_lengths(), tgt.row_lengths()
        src_bucket = tf.searchsorted(bounds, src_len, side="left", out_type=tf.int64)
        tgt_bucket = tf.searchsorted(bounds, tgt_len, side="left", out_type=tf.int64)
        # Sort by cell: larger bucket, then target bucket, source bucket, exact lengths.
        key = tf.maximum(src_bucket, tgt_bucket)
        for part, size in ((tgt_bucket, num_buckets), (src_bucket, num_buckets),
                           (tgt_len, max_length + 1), (src_len, max_length + 1)):
            key = key * size + part
        order = tf.argsort(key, stable=True)
        src, tgt = tf.gather(src, order), tf.gather(tgt, order)
        if pad_to_bucket:
            cap_src = tf.gather(bounds, tf.gather(src_bucket, order))
            cap_tgt = tf.gather(bounds, tf.gather(tgt_bucket, order))
        else:
            cap_src, cap_tgt = tf.gather(src_len, order), tf.gather(tgt_len, order)

        # Greedy cut: start a new batch when one more pair would exceed the budget.
        def step(state, lengths):
            batch_id, count, max_src, max_tgt = state
            new_src, new_tgt = tf.maximum(max_src, lengths[0]), tf.maximum(max_tgt, lengths[1])
            full = tf.logical_and(count > 0, (count + 1) * tf.maximum(new_src, new_tgt) > budget)
            zero = tf.zeros((), tf.int64)
            return (
                tf.where(full, batch_id + 1, batch_id),
                tf.where(full, zero + 1, count + 1),
                tf.where(full, lengths[0], new_src),
                tf.where(full, lengths[1], new_tgt),
            )

        zero = tf.zeros((), tf.int64)
        batch_ids = tf.scan(step, tf.stack([cap_src, cap_tgt], axis=1),
                            initializer=(zero, zero, zero, zero))[0]
        return tf.data.Dataset.from_tensor_slices((
            tf.RaggedTensor.from_value_rowids(src, batch_ids),
            tf.RaggedTensor.from_value_rowids(tgt, batch_ids),
        ))

    def pad(src, tgt):
        if not pad_to_bucket:
            return src.to_tensor(PAD_ID), tgt.to_tensor(PAD_ID)
        src_bound = tf.gather(bounds, tf.searchsorted(bounds, [tf.reduce_max(src.row_lengths())]))[0]
        tgt_bound = tf.gather(bounds, tf.searchsorted(bounds, [tf.reduce_max(tgt.row_lengths())]))[0]
        rows = budget // tf.maximum(src_bound, tgt_bound)
        return (src.to_tensor(PAD_ID, shape=tf.stack([rows, src_bound])),
                tgt.to_tensor(PAD_ID, shape=tf.stack([rows, tgt_bound])))

    def apply(dataset):
        dataset = dataset.ragged_batch(pool_size).flat_map(cut)
        if shuffle_buffer:
            dataset = dataset.shuffle(shuffle_buffer, seed=seed)
        return dataset.map(pad, num_parallel_calls=tf.data.AUTOTUNE)

    return apply


def shift_targets():
    """(src, [BOS] y [EOS]) -> ((src, [BOS] y), y [EOS]): decoder inputs and labels for fit."""

    def apply(dataset):
        return dataset.map(lambda src, tgt: ((src, tgt[:, :-1]), tgt[:, 1:]),
                           num_parallel_calls=tf.data.AUTOTUNE)

    return apply


def make_dataset(pairs, tokenizer, tokens_per_batch=25000, max_length=256, shuffle=True,
                 repeat=False, seed=None, pad_to_bucket=False, growth=1.1, pool_size=None):
    """Text pairs -> batches of ((source ids, decoder input ids), label ids).

    Args:
        pairs: Dataset of (source text, target text).
        tokenizer: a `SubwordTokenizer`.
        tokens_per_batch: token budget per side (per replica under tf.distribute).
        max_length: pairs longer than this (in tokens, with specials) are dropped.
        shuffle: shuffle sentences and batches (seeded by `seed`).
        repeat: loop over the data forever, each pass bucketed on its own (a pool that
            spanned passes would put copies of one pair into the same batch on small corpora).
        pad_to_bucket: static shapes from a fixed set (for XLA).
    """
    dataset = pairs.apply(tokenize_pairs(tokenizer)).apply(filter_by_length(max_length))
    pool_size = pool_size or 8 * tokens_per_batch
    if shuffle:
        dataset = dataset.shuffle(pool_size, seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.apply(bucket_by_length(
        tokens_per_batch, max_length, growth=growth, pad_to_bucket=pad_to_bucket,
        pool_size=pool_size, shuffle_buffer=256 if shuffle else 0, seed=seed,
    ))
    if repeat:  # after bucketing: a sorting pool never holds a pair twice
        dataset = dataset.repeat()
    return dataset.apply(shift_targets()).prefetch(tf.data.AUTOTUNE)
