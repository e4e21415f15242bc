"""tf.data steps from text pairs to training batches, for a tf.data source of your own. Each is
a factory returning `Callable[[tf.data.Dataset], tf.data.Dataset]`, applied with `ds.apply(...)`:

    pairs.apply(tokenize_pairs(tokenizer))          # (src ids + EOS, BOS + tgt ids + EOS)
         .apply(filter_by_length(max_length))       # drop over-long pairs (never truncate)
         .shuffle(...)                              # seeded
         .apply(bucket_by_length(tokens_per_batch)) # token-budget batches, both sides
         .apply(shift_targets())                    # ((src, tgt_in), tgt_out)
         .prefetch(tf.data.AUTOTUNE)

`make_dataset` strings them together. For example, training a model on two line-aligned files
with a run's vocabulary:

    import tensorflow as tf
    from pipelines import batching
    from pipelines.tokenizer import SubwordTokenizer

    tokenizer = SubwordTokenizer.load("runs/my-run/vocab/spm.model")
    pairs = tf.data.Dataset.zip((tf.data.TextLineDataset("train.en"),
                                 tf.data.TextLineDataset("train.de")))
    dataset = batching.make_dataset(pairs, tokenizer, tokens_per_batch=4096, max_length=128,
                                    seed=1, repeat=True)
    model.fit(dataset, steps_per_epoch=1000)

`keras-transformer train` reads prepared shards instead (`pipelines.prepared`): the tokenizing is
done once, and a resumed run starts at its exact batch.

Bucketing (`bucket_by_length`): sentences are drawn into pools of `pool_size`, and each pool is
cut into token-budget batches and padded by `pipelines.buckets`, the rule the prepared data's
batch plan uses: the same lengths give the same batches of the same shapes on both paths. The
batches are then shuffled. Cutting a sorted pool keeps batches full, where per-bucket
`group_by_window` batching leaves many part-filled buckets at the end of each pass.
"""

import logging

import numpy as np
import tensorflow as tf

from pipelines import buckets
from pipelines.buckets import geometric_boundaries  # noqa: F401  (re-exported)
from pipelines.defaults import (BATCH_SHUFFLE_BUFFER, GROWTH, MAX_LENGTH, MIN_BOUNDARY,
                                TOKENS_PER_BATCH)
from pipelines.special_ids import BOS_ID, EOS_ID

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


def bucket_by_length(tokens_per_batch, max_length=MAX_LENGTH, growth=GROWTH,
                     min_boundary=MIN_BOUNDARY, pad_to_bucket=False, pool_size=None,
                     shuffle_buffer=BATCH_SHUFFLE_BUFFER, seed=None):
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
        a Dataset -> Dataset step yielding (src (B, S), tgt (B, T)), padded with 0. The cut and
        the padding are `buckets.cut` and `buckets.pad` (numpy, through `tf.numpy_function`).
    """
    buckets.check_budget(tokens_per_batch, max_length)
    bounds = np.asarray(geometric_boundaries(max_length, min_boundary, growth), np.int64)
    pool_size = pool_size or 8 * tokens_per_batch

    def batch_ids(src_len, tgt_len):
        """(pool order, batch number of each pair in that order)."""
        order, starts = buckets.cut(src_len, tgt_len, bounds, tokens_per_batch, pad_to_bucket)
        first = np.zeros(len(order), np.int64)
        first[starts[1:]] = 1
        return order.astype(np.int64), np.cumsum(first)

    def cut(src, tgt):
        order, ids = tf.numpy_function(batch_ids, [src.row_lengths(), tgt.row_lengths()],
                                       (tf.int64, tf.int64), stateful=False)
        order.set_shape([None])
        ids.set_shape([None])
        src, tgt = tf.gather(src, order), tf.gather(tgt, order)
        return tf.data.Dataset.from_tensor_slices((
            tf.RaggedTensor.from_value_rowids(src, ids),
            tf.RaggedTensor.from_value_rowids(tgt, ids),
        ))

    def padded(src_ids, src_splits, tgt_ids, tgt_splits):
        src_len, tgt_len = np.diff(src_splits), np.diff(tgt_splits)
        rows = np.arange(len(src_len))
        num_rows, width_src, width_tgt = buckets.batch_shape(
            src_len.max(), tgt_len.max(), len(rows), bounds, tokens_per_batch, pad_to_bucket)
        return (buckets.pad(src_ids, src_splits[:-1], src_len, rows, num_rows,
                            width_src).astype(src_ids.dtype),
                buckets.pad(tgt_ids, tgt_splits[:-1], tgt_len, rows, num_rows,
                            width_tgt).astype(tgt_ids.dtype))

    def pad(src, tgt):
        src_out, tgt_out = tf.numpy_function(
            padded, [src.flat_values, src.row_splits, tgt.flat_values, tgt.row_splits],
            (src.dtype, tgt.dtype), stateful=False)
        src_out.set_shape([None, None])
        tgt_out.set_shape([None, None])
        return src_out, tgt_out

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


def make_dataset(pairs, tokenizer, tokens_per_batch=TOKENS_PER_BATCH, max_length=MAX_LENGTH,
                 shuffle=True, repeat=False, seed=None, pad_to_bucket=False, growth=GROWTH,
                 pool_size=None):
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
        pool_size=pool_size, shuffle_buffer=BATCH_SHUFFLE_BUFFER if shuffle else 0, seed=seed,
    ))
    if repeat:  # after bucketing: a sorting pool never holds a pair twice
        dataset = dataset.repeat()
    return dataset.apply(shift_targets()).prefetch(tf.data.AUTOTUNE)
