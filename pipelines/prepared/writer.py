"""Preparing a corpus: the shared vocabulary trained on a streamed sample, the pairs tokenized
on every core and written into shards of integer ids.

    data = prepare(folder, lambda: pairs, manifest={...}, vocabulary_settings={...})

`prepare` reads a source of (source text, target text) pairs, trains the shared vocabulary on a
bounded sample drawn while streaming (reservoir sampling), tokenizes with sentencepiece, drops
pairs longer than `max_length` (with their specials) and writes shards of `shard_pairs` source
pairs (the folder's files: `pipelines.prepared.store`). Every file is written under a temporary
name and renamed, so a killed `prepare` (or a full disk) leaves finished shards that the next
`prepare` keeps.
"""

import io
import itertools
import json
import logging
import os
import pathlib
import time

import numpy as np

from pipelines.defaults import MAX_LENGTH, SHARD_PAIRS, VOCABULARY_SAMPLE
from pipelines.errors import DataError
from pipelines.files import remove_stale_temporaries, write_bytes, write_json
from pipelines.prepared.store import (FORMAT_VERSION, MANIFEST, STATISTICS, VOCABULARY, Lock,
                                      PreparedData, read_json, sha256, shard_name)
from pipelines.vocabulary import FILENAME as VOCABULARY_FILE, train_vocabulary

log = logging.getLogger(__name__)


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
    name = shard_name(index)
    write_bytes(directory / f"{name}.npz", data)
    record = {"index": index, "file": f"{name}.npz", "read": int(len(src)),
              "pairs": int(keep.sum()), "dropped": int((~keep).sum()),
              "src_tokens": int(arrays["src_len"].sum() + keep.sum()),
              "tgt_tokens": int(arrays["tgt_len"].sum() + 2 * keep.sum()),
              "bytes": len(data), "sha256": sha256(data)}
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
            write_json(directory / f"{shard_name(record['index'])}.json", record)
    (directory / STATISTICS).unlink()
    return True


def prepare(directory, pairs, *, manifest, vocabulary=None, vocabulary_settings=None,
            max_length=MAX_LENGTH, shard_pairs=SHARD_PAIRS, total_pairs=None, progress=True,
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
    with Lock(directory):
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
            size = settings.setdefault("sample_size", VOCABULARY_SAMPLE)
            sample, seen = reservoir_sample(pairs(), size, settings.get("seed", 0), progress,
                                            total_pairs)
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
            "vocabulary_sha256": sha256(model_path.read_bytes()),
            "vocabulary": (read_json(directory / VOCABULARY)
                           if (directory / VOCABULARY).is_file() else {"given": True}),
            "seconds": round(time.monotonic() - started, 1),
            "shards": shards,
        }
        write_json(directory / STATISTICS, statistics)
        for index in range(len(shards)):  # the statistics hold the records now
            (directory / f"{shard_name(index)}.json").unlink(missing_ok=True)
    return PreparedData(directory)
