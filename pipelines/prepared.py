"""Prepared training data: a corpus tokenized once into shards of integer ids, read back as
token-budget batches from a deterministic position.

    data = prepare(folder, lambda: pairs, vocabulary_settings=..., max_length=256)
    plan = BatchPlan(data, tokens_per_batch=25000, seed=1234)
    dataset = plan.dataset(start=batches_done)   # ((source, decoder input), labels), int32

`prepare` reads a source of (source text, target text) pairs, trains the shared vocabulary on a
bounded sample drawn while streaming (reservoir sampling), tokenizes with sentencepiece on every
core, drops pairs longer than `max_length` (with their specials) and writes shards of
`shard_pairs` source pairs. A prepared folder:

    manifest.json       what it was prepared from and with (the cache key's contents)
    spm.model           the shared vocabulary (vocabulary.json: how it was trained)
    shard-00000.npz     src_ids, src_len, tgt_ids, tgt_len: ids without specials, uint16 when
                        the vocabulary fits (else int32); lengths uint16
    shard-00000.json    that shard's record: pairs, dropped, tokens, bytes, sha256
    statistics.json     written last: the totals and every shard's record (the data is complete)
    plans/KEY.json      batches per shard for one batching setting (a cache of `BatchPlan`)

Every file is written under a temporary name and renamed, so a killed `prepare` (or a full
disk) leaves finished shards that the next `prepare` keeps.

Why .npz shards: a shard is read whole, so numpy's uncompressed zip of four arrays is the
simplest format that loads at disk speed with no per-example parsing (TFRecord needs a protobuf
parse per pair and holds ids as varints), lets the lengths be read without the ids (the batch
plan needs only them), carries a CRC per array, and is readable by any numpy. `tf.data`
snapshots (save/load) are tied to a pipeline's element spec and TensorFlow's version and cannot
be checked shard by shard; ArrayRecord adds random access, which whole-shard reads do not need.

The batch stream (`BatchPlan`): each epoch visits this worker's shards in an order shuffled
with (seed, epoch), in groups of `group_shards` shards read together (the interleave). Inside a
group each shard's pairs are shuffled with (seed, epoch, shard), sorted by length cell and cut
greedily into batches of at most `tokens_per_batch` tokens per side (padding included), as
`batching.bucket_by_length` cuts; the group's batches are then shuffled with (seed, epoch,
group). A shard's number of batches depends only on its lengths, so the position of batch `k`
(epoch, group, offset) is arithmetic on the per-shard counts: resuming at batch 1,000,000 cuts
one group, it does not replay a million batches.
"""

import fcntl
import hashlib
import io
import json
import logging
import os
import pathlib
import time
import zipfile

import numpy as np

from pipelines.buckets import geometric_boundaries
from pipelines.errors import DataError
from pipelines.files import remove_stale_temporaries, write_bytes, write_json
from pipelines.special_ids import BOS_ID, EOS_ID, PAD_ID
from pipelines.vocabulary import FILENAME as VOCABULARY_FILE, train_vocabulary

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STATISTICS = "statistics.json"
VOCABULARY = "vocabulary.json"  # how the vocabulary was trained (sample size, seconds)
SHARD_PAIRS = 100_000  # source pairs per shard: 45 shards for WMT14 en-de, 360 for en-fr
ARRAYS = ("src_ids", "src_len", "tgt_ids", "tgt_len")


def default_cache_dir():
    """Where prepared data is kept unless `--data-cache` says otherwise:
    $KERAS_TRANSFORMER_DATA_CACHE, else $XDG_CACHE_HOME (default ~/.cache) /
    keras-transformer/data."""
    explicit = os.environ.get("KERAS_TRANSFORMER_DATA_CACHE")
    if explicit:
        return pathlib.Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "keras-transformer" / "data"


def cache_key(manifest):
    """A short key for a manifest: the same key means the same prepared data."""
    text = json.dumps({**manifest, "format_version": FORMAT_VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


_REDO = "delete it and run the same command again (prepare and train rebuild missing shards)"


def _shard_name(index):
    return f"shard-{index:05d}"


def _sha256(data):
    return hashlib.sha256(data).hexdigest()


def _read_json(path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataError(f"{path} is damaged ({error}); delete it and run prepare again.") from None


class PreparedData:
    """A prepared folder, complete (its statistics.json written).

    Attributes:
        directory, statistics (dict), shards (list of shard records), tokenizer_path.
    """

    def __init__(self, directory):
        self.directory = pathlib.Path(directory)
        path = self.directory / STATISTICS
        if not path.is_file():
            raise DataError(f"{self.directory} holds no complete prepared data (no {STATISTICS});"
                            " run `keras-transformer prepare` for it.")
        self.statistics = _read_json(path)
        self.shards = self.statistics["shards"]
        self.tokenizer_path = self.directory / VOCABULARY_FILE

    @staticmethod
    def is_complete(directory):
        return (pathlib.Path(directory) / STATISTICS).is_file()

    def __repr__(self):
        return f"PreparedData({str(self.directory)!r})"

    def shard_path(self, index):
        return self.directory / self.shards[index]["file"]

    def _fault(self, index, data=None, checksums=True):
        """What is wrong with a shard (its bytes `data`, if read), or None."""
        record, path = self.shards[index], self.shard_path(index)
        if data is None and not path.is_file():
            return "is missing"
        size = len(data) if data is not None else path.stat().st_size
        if size != record["bytes"]:
            return f"is truncated or damaged: {size} bytes, {record['bytes']} expected"
        if checksums and _sha256(data if data is not None else path.read_bytes()) != \
                record["sha256"]:
            return "is damaged (its SHA-256 differs from the one recorded)"
        return None

    def damaged(self, indices=None, checksums=True):
        """[(index, what is wrong)] of the shards that are missing, of another size than
        recorded or, with `checksums`, of another SHA-256."""
        indices = range(len(self.shards)) if indices is None else indices
        faults = [(index, self._fault(index, checksums=checksums)) for index in indices]
        return [(index, what) for index, what in faults if what]

    def check(self, indices=None, checksums=True):
        """Checks shards before training reads them (`damaged`); raises DataError naming the
        first bad file, what is wrong, and what to do."""
        for index, what in self.damaged(indices, checksums)[:1]:
            raise DataError(f"prepared shard {self.shard_path(index)} {what}; {_REDO}")

    def load(self, index, names=ARRAYS, verify=True):
        """The arrays of one shard ({name: array}); `verify` checks its checksum first."""
        path = self.shard_path(index)
        try:
            data = path.read_bytes()
            what = self._fault(index, data) if verify else None
            if what:
                raise DataError(f"prepared shard {path} {what}; {_REDO}")
            with np.load(io.BytesIO(data)) as arrays:
                return {name: arrays[name] for name in names}
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
            raise DataError(f"prepared shard {path} cannot be read ({error}); {_REDO}") \
                from None

    def lengths(self, index, arrays=None):
        """(source lengths, target lengths) of a shard's pairs, with their specials (EOS;
        BOS and EOS), from its loaded `arrays` or read from the file."""
        if arrays is None:
            arrays = self.load(index, ("src_len", "tgt_len"), verify=False)
        return arrays["src_len"].astype(np.int64) + 1, arrays["tgt_len"].astype(np.int64) + 2


# -- preparing ---------------------------------------------------------------------------------


class _Lock:
    """An exclusive lock on a folder (another process preparing the same data waits)."""

    def __init__(self, directory):
        self.path = pathlib.Path(directory) / ".lock"

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "w")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("%s is being prepared by another process; waiting for it", self.path.parent)
            fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        fcntl.flock(self.file, fcntl.LOCK_UN)
        self.file.close()


def _text_batches(pairs, size):
    """Numpy batches of (source bytes, target bytes) from a tf.data dataset of string pairs."""
    import tensorflow as tf

    return pairs.batch(size).prefetch(tf.data.AUTOTUNE).as_numpy_iterator()


def _decode(items, what):
    try:
        return [item.decode("utf-8") for item in items]
    except UnicodeDecodeError as error:
        raise DataError(f"{what}: invalid UTF-8 ({error.reason}).") from None


def reservoir_sample(pairs, size, seed=0, progress=False, total=None):
    """At most `size` sentences drawn uniformly from both sides of `pairs` in one streamed pass
    (reservoir sampling), in the memory of `size` sentences.

    Returns:
        (the sample, sentences seen).
    """
    from pipelines.progress import progress_bar

    rng = np.random.default_rng(seed)
    sample, seen = [], 0
    bar = progress_bar(total=total, desc="vocabulary: sampling", unit=" pairs",
                       disable=not progress, interval=1.0)
    for src, tgt in _text_batches(pairs, 4096):
        bar.update(len(src))
        texts = [t for t in _decode(np.concatenate([src, tgt]), "vocabulary sample") if t]
        free = max(0, size - len(sample))
        sample += texts[:free]
        rest = texts[free:]
        if rest:  # algorithm R: item t (1-based) replaces a random slot with probability size/t
            ranks = seen + free + 1 + np.arange(len(rest))
            slots = (rng.random(len(rest)) * ranks).astype(np.int64)
            for text, slot in zip(rest, slots.tolist()):
                if slot < size:
                    sample[slot] = text
        seen += len(texts)
    bar.close()
    return sample, seen


def _encode(processor, texts):
    """Lists of ids -> (flat ids, lengths) as numpy arrays."""
    import itertools

    ids = processor.encode(texts, num_threads=os.cpu_count() or 1)
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    flat = np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(lengths.sum()))
    return flat, lengths


def _write_shard(directory, index, processor, src, tgt, max_length, id_dtype):
    """Tokenizes one chunk of pairs and writes its shard and record. Returns the record."""
    src_ids, src_len = _encode(processor, _decode(src, f"shard {index} source text"))
    tgt_ids, tgt_len = _encode(processor, _decode(tgt, f"shard {index} target text"))
    keep = (src_len + 1 <= max_length) & (tgt_len + 2 <= max_length)
    arrays = {}
    for name, ids, lengths in (("src", src_ids, src_len), ("tgt", tgt_ids, tgt_len)):
        arrays[f"{name}_ids"] = ids[np.repeat(keep, lengths)].astype(id_dtype)
        arrays[f"{name}_len"] = lengths[keep].astype(np.uint16)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    data = buffer.getvalue()
    name = _shard_name(index)
    write_bytes(directory / f"{name}.npz", data)
    record = {"index": index, "file": f"{name}.npz", "read": int(len(src)),
              "pairs": int(keep.sum()), "dropped": int((~keep).sum()),
              "src_tokens": int(arrays["src_len"].sum() + keep.sum()),
              "tgt_tokens": int(arrays["tgt_len"].sum() + 2 * keep.sum()),
              "bytes": len(data), "sha256": _sha256(data)}
    write_json(directory / f"{name}.json", record)  # last: the shard counts as finished
    return record


def _finished_shards(directory):
    """{index: record} of the shards an earlier `prepare` finished (record and file present)."""
    finished = {}
    for path in sorted(directory.glob("shard-*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue  # redo it
        shard = directory / record.get("file", "")
        if shard.is_file() and shard.stat().st_size == record.get("bytes"):
            finished[record["index"]] = record
    return finished


def _reopen(directory, checksums, progress):
    """Complete data with damaged shards made incomplete again: the good shards get their
    records back (so they count as finished), the bad ones are deleted, statistics.json goes.
    Returns whether anything was damaged."""
    data = PreparedData(directory)
    bad = dict(data.damaged(checksums=checksums))
    if not bad:
        return False
    for index, what in bad.items():
        log.warning("prepared shard %s %s: preparing it again", data.shard_path(index), what)
        if progress:
            print(f"prepare: shard {data.shard_path(index)} {what}: preparing it again",
                  flush=True)
        data.shard_path(index).unlink(missing_ok=True)
    for record in data.shards:
        if record["index"] not in bad:
            write_json(directory / f"{_shard_name(record['index'])}.json", record)
    (directory / STATISTICS).unlink()
    return True


def prepare(directory, pairs, *, manifest, vocabulary=None, vocabulary_settings=None,
            max_length=256, shard_pairs=SHARD_PAIRS, total_pairs=None, progress=True,
            verify=False):
    """Prepares (or finishes preparing) a corpus into `directory`; returns `PreparedData`.

    Args:
        directory: the prepared folder (usually `cache / name-key`, see `cache_key`).
        pairs: a callable returning a tf.data.Dataset of (source, target) strings, in a fixed
            order (it is read once for the vocabulary sample and once for the shards).
        manifest: what the data is prepared from and with (JSON); saved as manifest.json.
        vocabulary: a sentencepiece model (bytes) to use; None trains one on a sample.
        vocabulary_settings: `train_tokenizer` arguments (vocab_size, model_type,
            sample_size, seed, user_symbols) when training one.
        max_length: pairs whose source (+EOS) or target (+BOS, EOS) is longer are dropped.
        shard_pairs: source pairs per shard.
        total_pairs: the source's size if known (for the progress bar).
        progress: progress bars and a closing line.
        verify: check finished data's checksums too (missing and truncated shards are always
            found); damaged shards are prepared again.
    """
    import sentencepiece as spm
    from pipelines.progress import progress_bar

    directory = pathlib.Path(directory)
    if PreparedData.is_complete(directory) and not PreparedData(directory).damaged(
            checksums=verify):
        return PreparedData(directory)
    with _Lock(directory):
        if PreparedData.is_complete(directory):  # done, perhaps by another process meanwhile
            if not _reopen(directory, verify, progress):
                return PreparedData(directory)
        started = time.monotonic()
        remove_stale_temporaries(directory)
        write_json(directory / MANIFEST, {**manifest, "format_version": FORMAT_VERSION})
        model_path = directory / VOCABULARY_FILE
        if vocabulary is not None:
            if not model_path.is_file() or model_path.read_bytes() != bytes(vocabulary):
                write_bytes(model_path, bytes(vocabulary))
        elif not model_path.is_file():
            settings = dict(vocabulary_settings or {})
            sample, seen = reservoir_sample(pairs(), settings.get("sample_size", 2_000_000),
                                            settings.get("seed", 0), progress, total_pairs)
            settings["sample_size"] = settings.get("sample_size", 2_000_000)
            tokenizer = train_vocabulary(sample, progress=progress, **settings)
            del sample
            write_json(directory / VOCABULARY, {
                "sentences_seen": seen, "sample": tokenizer.training.sentences,
                "seconds": tokenizer.training.seconds})
            write_bytes(model_path, tokenizer.model_proto)
        processor = spm.SentencePieceProcessor(model_proto=model_path.read_bytes())
        id_dtype = np.uint16 if processor.get_piece_size() <= 65536 else np.int32

        finished = _finished_shards(directory)
        first = 0
        while first in finished:
            first += 1
        if finished and progress:
            print(f"prepare: keeping {len(finished)} finished shards of an earlier run",
                  flush=True)
        records = dict(finished)
        bar = progress_bar(total=total_pairs, initial=first * shard_pairs,
                           desc="prepare: tokenizing", unit=" pairs", disable=not progress,
                           interval=1.0)
        index = first
        try:
            for src, tgt in _text_batches(pairs().skip(first * shard_pairs), shard_pairs):
                if index not in records:
                    records[index] = _write_shard(directory, index, processor, src, tgt,
                                                  max_length, id_dtype)
                bar.update(len(src))
                index += 1
        except OSError as error:
            raise DataError(f"writing prepared data into {directory} failed ({error}); the "
                            f"{len(_finished_shards(directory))} finished shards are kept: fix "
                            "the cause (e.g. free disk space) and run prepare again.") from None
        finally:
            bar.close()
        shards = [records[i] for i in range(index)]
        if not shards or not sum(r["pairs"] for r in shards):
            raise DataError(f"No training pairs to prepare into {directory}: the source is "
                            f"empty or every pair is longer than max_length={max_length}.")
        statistics = {
            "format_version": FORMAT_VERSION,
            "pairs": sum(r["pairs"] for r in shards),
            "read": sum(r["read"] for r in shards),
            "dropped_too_long": sum(r["dropped"] for r in shards),
            "src_tokens": sum(r["src_tokens"] for r in shards),
            "tgt_tokens": sum(r["tgt_tokens"] for r in shards),
            "bytes": sum(r["bytes"] for r in shards),
            "max_length": max_length, "shard_pairs": shard_pairs,
            "vocab_size": processor.get_piece_size(),
            "vocabulary_sha256": _sha256(model_path.read_bytes()),
            "vocabulary": (_read_json(directory / VOCABULARY)
                           if (directory / VOCABULARY).is_file() else {"given": True}),
            "seconds": round(time.monotonic() - started, 1),
            "shards": shards,
        }
        write_json(directory / STATISTICS, statistics)
        for index in range(len(shards)):  # the statistics hold the records now
            (directory / f"{_shard_name(index)}.json").unlink(missing_ok=True)
    return PreparedData(directory)


def describe(data):
    """One line about prepared data (for logs and the `prepare` command)."""
    s = data.statistics
    shards = len(data.shards)
    return (f"prepared data {data.directory}: {s['pairs']:,} pairs in {shards} "
            f"shard{'s' if shards != 1 else ''} ({s['bytes'] / 2**20:,.1f} MiB), "
            f"{s['src_tokens']:,} source and {s['tgt_tokens']:,} target tokens; "
            f"{s['dropped_too_long']:,} pairs longer than "
            f"max_length={s['max_length']} are dropped")


# -- batches -----------------------------------------------------------------------------------


def cut_batches(src_len, tgt_len, bounds, tokens_per_batch, pad_to_bucket=False):
    """Sorts pairs by length cell and cuts them greedily into token-budget batches.

    Args:
        src_len, tgt_len: lengths with specials (int64 arrays).
        bounds: `geometric_boundaries`.
        tokens_per_batch: the budget per side, padding included.
        pad_to_bucket: budget the bucket boundaries rather than the exact lengths.

    Returns:
        (order, starts): pair indices in batch order, and where each batch starts in `order`.
        The number of batches depends only on the multiset of lengths, not on their order.
    """
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


def _pad(flat, offsets, lengths, rows, width, num_rows, before, after):
    """Rows of `flat` (by offset and length) with `before`/`after` specials, padded to
    (num_rows, width) int32."""
    out = np.full((num_rows, width), PAD_ID, np.int32)
    length = lengths[rows]
    columns = np.arange(width - (before is not None))
    inside = columns[None, :] < length[:, None]
    index = np.minimum(offsets[rows][:, None] + columns[None, :], max(len(flat) - 1, 0))
    body = out[:len(rows), 1:] if before is not None else out[:len(rows)]
    body[inside] = flat[index[inside]] if len(flat) else 0
    if before is not None:
        out[:len(rows), 0] = before
    out[np.arange(len(rows)), length + (before is not None)] = after
    return out


def batches_of_pairs(source_ids, target_ids, tokens_per_batch, max_length=256, growth=1.1,
                     min_boundary=8):
    """Token-budget batches of tokenized pairs in length order (a dev set, in plain numpy),
    padded to their length cell as `BatchPlan(pad_to_bucket=True)` pads.

    Args:
        source_ids, target_ids: lists of id lists without specials.

    Returns:
        (list of ((source, decoder input), labels) int32 arrays, pairs left out as longer than
        max_length with their specials).
    """
    src_n = np.fromiter(map(len, source_ids), np.int64, len(source_ids))
    tgt_n = np.fromiter(map(len, target_ids), np.int64, len(target_ids))
    kept = np.flatnonzero((src_n + 1 <= max_length) & (tgt_n + 1 <= max_length))
    if not len(kept):
        return [], len(source_ids)
    arrays = {"src_n": src_n, "tgt_n": tgt_n}
    for side, ids, lengths in (("src", source_ids, src_n), ("tgt", target_ids, tgt_n)):
        arrays[f"{side}_ids"] = np.fromiter((i for row in ids for i in row), np.int64,
                                            int(lengths.sum()))
        arrays[f"{side}_off"] = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    bounds = np.asarray(geometric_boundaries(max_length, min_boundary, growth), np.int64)
    order, starts = cut_batches(src_n[kept] + 1, tgt_n[kept] + 1, bounds, tokens_per_batch,
                                pad_to_bucket=True)
    batches = []
    for rows in np.split(kept[order], starts[1:]):
        batches.append(_padded_batch(arrays, rows, bounds, tokens_per_batch))
    return batches, len(source_ids) - len(kept)


def _padded_batch(arrays, rows, bounds, tokens_per_batch=None):
    """((source, decoder input), labels) of `rows`; with `tokens_per_batch`, widths padded to
    their length cell and rows to the cell's capacity (fixed shapes for XLA)."""
    src_len, tgt_len = arrays["src_n"], arrays["tgt_n"]
    width_src = int(src_len[rows].max()) + 1
    width_tgt = int(tgt_len[rows].max()) + 2
    num_rows = len(rows)
    if tokens_per_batch is not None:
        width_src = int(bounds[min(np.searchsorted(bounds, width_src), len(bounds) - 1)])
        width_tgt = int(bounds[min(np.searchsorted(bounds, width_tgt), len(bounds) - 1)])
        width_src, width_tgt = max(width_src, int(src_len[rows].max()) + 1), max(
            width_tgt, int(tgt_len[rows].max()) + 2)
        num_rows = max(tokens_per_batch // max(width_src, width_tgt), len(rows))
    src = _pad(arrays["src_ids"], arrays["src_off"], src_len, rows, width_src, num_rows,
               None, EOS_ID)
    tgt = _pad(arrays["tgt_ids"], arrays["tgt_off"], tgt_len, rows, width_tgt, num_rows,
               BOS_ID, EOS_ID)
    return (src, tgt[:, :-1]), tgt[:, 1:]


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
    """

    def __init__(self, data, tokens_per_batch, max_length=256, seed=0, growth=1.1,
                 min_boundary=8, pad_to_bucket=False, worker=0, num_workers=1, group_shards=8):
        if tokens_per_batch < max_length:
            raise DataError(f"tokens_per_batch={tokens_per_batch} cannot hold one pair of "
                            f"max_length={max_length}; raise the budget or lower max_length.")
        if max_length > data.statistics["max_length"]:
            raise DataError(f"{data.directory} was prepared with max_length="
                            f"{data.statistics['max_length']}; prepare it again for "
                            f"max_length={max_length}.")
        self.data, self.seed = data, seed
        self.tokens_per_batch, self.max_length = tokens_per_batch, max_length
        self.pad_to_bucket, self.group_shards = pad_to_bucket, group_shards
        self.bounds = np.asarray(geometric_boundaries(max_length, min_boundary, growth), np.int64)
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
            counts[index] = len(cut_batches(src_len, tgt_len, self.bounds,
                                            self.tokens_per_batch, self.pad_to_bucket)[1])
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
            arrays = self.data.load(index)
            for side in ("src", "tgt"):  # once per shard: the batches index into these
                arrays[f"{side}_n"] = arrays[f"{side}_len"].astype(np.int64)
                arrays[f"{side}_off"] = np.concatenate([[0], np.cumsum(arrays[f"{side}_n"])[:-1]])
            src_len, tgt_len, kept = self._lengths(index, arrays)
            shuffle = np.random.default_rng([self.seed, epoch, index]).permutation(len(kept))
            order, starts = cut_batches(src_len[shuffle], tgt_len[shuffle], self.bounds,
                                        self.tokens_per_batch, self.pad_to_bucket)
            if not len(starts):
                continue
            if len(starts) != self.counts[index]:
                raise DataError(f"prepared shard {self.data.shard_path(index)} changed since its "
                                "batch plan was made; delete its plans/ folder.")
            batches += [(arrays, part) for part in np.split(kept[shuffle[order]], starts[1:])]
        mix = np.random.default_rng([self.seed, epoch, 1_000_003 + group])
        return [batches[i] for i in mix.permutation(len(batches))]

    def _tensors(self, arrays, rows):
        return _padded_batch(arrays, rows, self.bounds,
                             self.tokens_per_batch if self.pad_to_bucket else None)

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
                    yield self._tensors(arrays, rows)
                    number += 1
                offset = 0
            epoch, group = epoch + 1, 0

    def dataset(self, start=0):
        """The batch stream as a tf.data.Dataset (prefetched), from batch number `start`."""
        import tensorflow as tf

        matrix = tf.TensorSpec([None, None], tf.int32)
        return tf.data.Dataset.from_generator(
            lambda: self.batches(start), output_signature=((matrix, matrix), matrix),
        ).prefetch(tf.data.AUTOTUNE)


def training_dataset(data, tokens_per_batch, max_length=256, seed=0, pad_to_bucket=False,
                     worker=0, num_workers=1, start=0):
    """What training reads: this worker's shards checked (sizes and checksums, so a damaged
    one is named before training starts), their batch plan, and its stream from batch `start`.

    Returns:
        (BatchPlan, tf.data.Dataset of ((source, decoder input), labels)).
    """
    plan = BatchPlan(data, tokens_per_batch, max_length, seed, pad_to_bucket=pad_to_bucket,
                     worker=worker, num_workers=num_workers)
    data.check(plan.shards)
    return plan, plan.dataset(start)
