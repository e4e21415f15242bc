"""The batches of prepared data: a deterministic stream of token-budget batches for training
(`BatchPlan`), and the dev set's batches (`batches_of_pairs`), cut and padded alike.

    plan = BatchPlan(data, tokens_per_batch=25000, seed=1234)
    dataset = plan.dataset(start=batches_done)   # ((source, decoder input), labels), int32

The stream: each epoch visits this worker's shards in an order shuffled with (seed, epoch), in
groups of `group_shards` shards read together (the interleave). Inside a group each shard's
pairs are shuffled with (seed, epoch, shard), then cut and padded by `pipelines.buckets` (the
rule `batching.bucket_by_length` cuts by too); the group's batches are shuffled with (seed,
epoch, group). A shard's number of batches depends only on its lengths, so the position of
batch `k` (epoch, group, offset) is arithmetic on the per-shard counts: resuming at batch
1,000,000 cuts one group, it does not replay a million batches.
"""

import hashlib
import json
import logging

import numpy as np

from pipelines import buckets
from pipelines.defaults import GROUP_SHARDS, GROWTH, MAX_LENGTH, MIN_BOUNDARY
from pipelines.errors import DataError
from pipelines.files import write_json
from pipelines.special_ids import BOS_ID, EOS_ID

log = logging.getLogger(__name__)


def with_offsets(arrays):
    """Shard-style arrays (src_ids, src_len, tgt_ids, tgt_len) with each side's lengths as
    int64 (`src_n`, `tgt_n`) and where each sequence starts in the flat ids (`*_off`)."""
    for side in ("src", "tgt"):
        lengths = np.asarray(arrays[f"{side}_len"]).astype(np.int64)
        arrays[f"{side}_n"] = lengths
        arrays[f"{side}_off"] = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return arrays


def padded_batch(arrays, rows, bounds, tokens_per_batch, pad_to_bucket=False, devices=None,
                 shape_bounds=None):
    """((source, decoder input), labels) int32 of the pairs `rows` of `arrays` (`with_offsets`)
    in the shape `buckets.batch_shape` gives: source + EOS; BOS + target + EOS shifted into the
    decoder input (BOS + target) and the labels (target + EOS). With `devices`, the same values
    in the larger fixed shape `buckets.fixed_shape` gives for XLA, by the cells `shape_bounds`
    (default `bounds`)."""
    src_n, tgt_n = arrays["src_n"], arrays["tgt_n"]
    shape = buckets.batch_shape(int(src_n[rows].max()) + 1, int(tgt_n[rows].max()) + 2,
                                len(rows), bounds, tokens_per_batch, pad_to_bucket)
    num_rows, columns_src, columns_tgt = (
        buckets.fixed_shape(shape, bounds if shape_bounds is None else shape_bounds,
                            tokens_per_batch, devices) if devices else shape)
    _, width_src, width_tgt = shape
    src = buckets.pad(arrays["src_ids"], arrays["src_off"], src_n, rows, num_rows, width_src,
                      after=EOS_ID, columns=columns_src)
    decoder_input, labels = (
        buckets.pad(arrays["tgt_ids"], arrays["tgt_off"], tgt_n, rows, num_rows, width_tgt - 1,
                    before=before, after=EOS_ID, columns=columns_tgt - 1)
        for before in (BOS_ID, None))
    return (src, decoder_input), labels


def as_dataset(batches):
    """A tf.data.Dataset (prefetched) of the ((source, decoder input), labels) int32 batches
    that `batches()` yields."""
    import tensorflow as tf

    matrix = tf.TensorSpec([None, None], tf.int32)
    return tf.data.Dataset.from_generator(
        batches, output_signature=((matrix, matrix), matrix)).prefetch(tf.data.AUTOTUNE)


def batches_of_pairs(source_ids, target_ids, tokens_per_batch, max_length=MAX_LENGTH,
                     pad_to_bucket=False, devices=None, growth=GROWTH,
                     min_boundary=MIN_BOUNDARY, static=False):
    """Token-budget batches of tokenized pairs in length order (a dev set), cut and padded as
    `BatchPlan` cuts and pads with the same settings.

    Args:
        source_ids, target_ids: lists of id lists without specials.
        pad_to_bucket, devices, static: as for `BatchPlan`.

    Returns:
        (list of ((source, decoder input), labels) int32 arrays, pairs left out as longer than
        max_length with their specials: source + EOS, BOS + target + EOS, as `prepare` drops).
    """
    arrays = {}
    for side, ids in (("src", source_ids), ("tgt", target_ids)):
        arrays[f"{side}_len"] = np.fromiter(map(len, ids), np.int64, len(ids))
        arrays[f"{side}_ids"] = np.fromiter((i for row in ids for i in row), np.int64,
                                            int(arrays[f"{side}_len"].sum()))
    arrays = with_offsets(arrays)
    src_len, tgt_len = arrays["src_n"] + 1, arrays["tgt_n"] + 2
    kept = np.flatnonzero((src_len <= max_length) & (tgt_len <= max_length))
    bounds = np.asarray(buckets.geometric_boundaries(max_length, min_boundary, growth), np.int64)
    order, starts = buckets.cut(src_len[kept], tgt_len[kept], bounds, tokens_per_batch,
                                pad_to_bucket)
    devices, shape_bounds = _static_shapes(static, devices, max_length)
    batches = [padded_batch(arrays, rows, bounds, tokens_per_batch, pad_to_bucket, devices,
                            shape_bounds)
               for rows in np.split(kept[order], starts[1:])] if len(kept) else []
    return batches, len(source_ids) - len(kept)


def _static_shapes(static, devices, max_length):
    """(devices, shape bounds) for `padded_batch`: with `static`, fixed shapes (on at least one
    device) by the coarse cells of `buckets.static_boundaries`."""
    if not static:
        return devices, None
    return devices or 1, np.asarray(buckets.static_boundaries(max_length), np.int64)


class BatchPlan:
    """The deterministic stream of training batches over prepared data, for one input pipeline.

    Args:
        data: `PreparedData`.
        tokens_per_batch: budget per side, padding included (per replica).
        max_length: the longest pair allowed in (as prepared, or shorter).
        seed: the shuffles are seeded with (seed, epoch, shard or group).
        growth, min_boundary: the geometric length cells.
        pad_to_bucket: pad lengths to their cell boundary and batches to the cell's capacity
            (a small fixed set of shapes, for XLA).
        worker, num_workers: this pipeline reads shards `worker`, `worker + num_workers`, ...
            (file-level sharding: workers read disjoint files).
        group_shards: shards read together and mixed (memory: that many shards).
        devices: pad every batch to a fixed shape for XLA (`buckets.fixed_shape`), its rows a
            multiple of `devices`; None keeps the shapes of `pad_to_bucket`. The batches hold
            the same pairs in the same order either way.
        static: the fixed shapes (on `devices`, or one) by the coarse cells of
            `buckets.static_boundaries` rather than the length cells: on Multi30k 6 shapes
            instead of 22, for about 1.3 times the padded tokens. Same batches again.
    """

    def __init__(self, data, tokens_per_batch, max_length=MAX_LENGTH, seed=0, growth=GROWTH,
                 min_boundary=MIN_BOUNDARY, pad_to_bucket=False, worker=0, num_workers=1,
                 group_shards=GROUP_SHARDS, devices=None, static=False):
        try:
            buckets.check_budget(tokens_per_batch, max_length)
        except ValueError as error:
            raise DataError(str(error)) from None
        if max_length > data.statistics["max_length"]:
            raise DataError(f"{data.directory} was prepared with max_length="
                            f"{data.statistics['max_length']}; prepare it again for "
                            f"max_length={max_length}.")
        self.data, self.seed = data, seed
        self.tokens_per_batch, self.max_length = tokens_per_batch, max_length
        self.pad_to_bucket, self.group_shards = pad_to_bucket, group_shards
        self.bounds = np.asarray(buckets.geometric_boundaries(max_length, min_boundary, growth),
                                 np.int64)
        self.devices, self.shape_bounds = _static_shapes(static, devices, max_length)
        self.shards = list(range(worker, len(data.shards), num_workers))
        if len(data.shards) < num_workers:  # some worker would have nothing to read
            raise DataError(
                f"{data.directory} has {len(data.shards)} shard(s), fewer than the {num_workers} "
                "workers reading it: prepare it again with a smaller --shard-pairs.")
        self.counts = self._batch_counts()
        self.batches_per_epoch = sum(self.counts[i] for i in self.shards)
        if not self.batches_per_epoch:
            raise DataError(f"{data.directory}: no pair of shards {self.shards} fits "
                            f"max_length={max_length}.")

    # The plan: batches per shard, cached in the prepared folder per batching setting.
    def _settings(self):
        return {"tokens_per_batch": self.tokens_per_batch, "max_length": self.max_length,
                "bounds": self.bounds.tolist(), "pad_to_bucket": self.pad_to_bucket,
                "vocabulary_sha256": self.data.statistics["vocabulary_sha256"]}

    def _batch_counts(self):
        key = hashlib.sha256(json.dumps(self._settings(), sort_keys=True).encode()).hexdigest()
        path = self.data.directory / "plans" / f"{key[:16]}.json"
        counts = {}
        if path.is_file():
            try:
                counts = {int(k): v for k, v in json.loads(path.read_text())["counts"].items()}
            except (OSError, ValueError, KeyError):
                counts = {}
        missing = [i for i in self.shards if i not in counts]
        for index in missing:
            src_len, tgt_len, _ = self._lengths(index)
            counts[index] = len(buckets.cut(src_len, tgt_len, self.bounds, self.tokens_per_batch,
                                            self.pad_to_bucket)[1])
        if missing:
            try:
                write_json(path, {"settings": self._settings(),
                                  "counts": {str(k): v for k, v in sorted(counts.items())}})
            except OSError as error:  # a read-only cache still trains
                log.info("could not cache the batch plan in %s (%s)", path, error)
        return counts

    def _lengths(self, index, arrays=None):
        """(source lengths, target lengths, their pair indices) of the shard's pairs that fit
        `max_length` (all of them unless it is below the prepared one)."""
        src_len, tgt_len = self.data.lengths(index, arrays)
        kept = np.flatnonzero((src_len <= self.max_length) & (tgt_len <= self.max_length))
        return src_len[kept], tgt_len[kept], kept

    # Positions.
    def groups(self, epoch):
        """The shard groups of an epoch, in order."""
        order = np.random.default_rng([self.seed, epoch]).permutation(self.shards).tolist()
        return [order[i:i + self.group_shards] for i in range(0, len(order),
                                                               self.group_shards)]

    def position(self, batches):
        """Batch number `batches` (0-based, counted from the start of training) ->
        (epoch, group, offset inside the group)."""
        epoch, rest = divmod(int(batches), self.batches_per_epoch)
        for group, shards in enumerate(self.groups(epoch)):
            size = sum(self.counts[i] for i in shards)
            if rest < size:
                return epoch, group, rest
            rest -= size
        raise AssertionError("unreachable: the epoch's groups hold every batch")

    # Batches.
    def _group_batches(self, epoch, group, shards):
        """[(shard arrays, rows)] of one group's batches, in their shuffled order."""
        batches = []
        for index in shards:
            arrays = with_offsets(self.data.load(index))  # once per shard: batches index these
            src_len, tgt_len, kept = self._lengths(index, arrays)
            shuffle = np.random.default_rng([self.seed, epoch, index]).permutation(len(kept))
            order, starts = buckets.cut(src_len[shuffle], tgt_len[shuffle], self.bounds,
                                        self.tokens_per_batch, self.pad_to_bucket)
            if not len(starts):
                continue
            if len(starts) != self.counts[index]:
                raise DataError(f"prepared shard {self.data.shard_path(index)} changed since its "
                                "batch plan was made; delete its plans/ folder.")
            batches += [(arrays, part) for part in np.split(kept[shuffle[order]], starts[1:])]
        mix = np.random.default_rng([self.seed, epoch, 1_000_003 + group])
        return [batches[i] for i in mix.permutation(len(batches))]

    def batches(self, start=0, stop=None):
        """Yields ((source, decoder input), labels) int32 arrays from batch number `start`
        (forever, or up to `stop`)."""
        epoch, group, offset = self.position(start)
        number = start
        while True:
            groups = self.groups(epoch)
            for group_index in range(group, len(groups)):
                for arrays, rows in self._group_batches(epoch, group_index,
                                                        groups[group_index])[offset:]:
                    if stop is not None and number >= stop:
                        return
                    yield padded_batch(arrays, rows, self.bounds, self.tokens_per_batch,
                                       self.pad_to_bucket, self.devices, self.shape_bounds)
                    number += 1
                offset = 0
            epoch, group = epoch + 1, 0

    def dataset(self, start=0):
        """The batch stream as a tf.data.Dataset (prefetched), from batch number `start`."""
        return as_dataset(lambda: self.batches(start))


def training_dataset(data, tokens_per_batch, max_length=MAX_LENGTH, seed=0, pad_to_bucket=False,
                     worker=0, num_workers=1, start=0, static=False):
    """What training reads: this worker's shards checked (sizes and checksums, so a damaged
    one is named before training starts), their batch plan, and its stream from batch `start`.

    Returns:
        (BatchPlan, tf.data.Dataset of ((source, decoder input), labels)).
    """
    plan = BatchPlan(data, tokens_per_batch, max_length, seed, pad_to_bucket=pad_to_bucket,
                     worker=worker, num_workers=num_workers, static=static)
    data.check(plan.shards)
    return plan, plan.dataset(start)
