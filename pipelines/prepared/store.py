"""The prepared folder: what is in it, its checks, its place in the cache, and its lock.

    manifest.json       what it was prepared from and with (the cache key's contents)
    spm.model           the shared vocabulary (vocabulary.json: how it was trained)
    shard-00000.npz     src_ids, src_len, tgt_ids, tgt_len: ids without specials, uint16 when
                        the vocabulary fits (else int32); lengths uint16
    shard-00000.json    that shard's record: pairs, dropped, tokens, bytes, sha256
    statistics.json     written last: the totals and every shard's record (the data is complete)
    plans/KEY.json      batches per shard for one batching setting (a cache of `BatchPlan`)

Why .npz shards: a shard is read whole, so numpy's uncompressed zip of four arrays is the
simplest format that loads at disk speed with no per-example parsing (TFRecord needs a protobuf
parse per pair and holds ids as varints), lets the lengths be read without the ids (the batch
plan needs only them), carries a CRC per array, and is readable by any numpy. `tf.data`
snapshots (save/load) are tied to a pipeline's element spec and TensorFlow's version and cannot
be checked shard by shard; ArrayRecord adds random access, which whole-shard reads do not need.
"""

import hashlib
import io
import json
import logging
import os
import pathlib
import zipfile

import numpy as np

from pipelines.errors import DataError
from pipelines.lock import FolderLock
from pipelines.vocabulary import FILENAME as VOCABULARY_FILE

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STATISTICS = "statistics.json"
VOCABULARY = "vocabulary.json"  # how the vocabulary was trained (sample size, seconds)
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


REDO = "delete it and run the same command again (prepare and train rebuild missing shards)"


def shard_name(index):
    return f"shard-{index:05d}"


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def read_json(path):
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
        self.statistics = read_json(path)
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
        if checksums and sha256(data if data is not None else path.read_bytes()) != \
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
            raise DataError(f"prepared shard {self.shard_path(index)} {what}; {REDO}")

    def load(self, index, names=ARRAYS, verify=True):
        """The arrays of one shard ({name: array}); `verify` checks its checksum first."""
        path = self.shard_path(index)
        try:
            data = path.read_bytes()
            what = self._fault(index, data) if verify else None
            if what:
                raise DataError(f"prepared shard {path} {what}; {REDO}")
            with np.load(io.BytesIO(data)) as arrays:
                return {name: arrays[name] for name in names}
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:
            raise DataError(f"prepared shard {path} cannot be read ({error}); {REDO}") \
                from None

    def lengths(self, index, arrays=None):
        """(source lengths, target lengths) of a shard's pairs, with their specials (EOS;
        BOS and EOS), from its loaded `arrays` or read from the file."""
        if arrays is None:
            arrays = self.load(index, ("src_len", "tgt_len"), verify=False)
        return arrays["src_len"].astype(np.int64) + 1, arrays["tgt_len"].astype(np.int64) + 2


class Lock(FolderLock):
    """An exclusive lock on a folder (another process preparing the same data waits)."""

    def __init__(self, directory):
        super().__init__(directory, "preparing", wait=True)


def describe(data):
    """One line about prepared data (for logs and the `prepare` command)."""
    s = data.statistics
    shards = len(data.shards)
    return (f"prepared data {data.directory}: {s['pairs']:,} pairs in {shards} "
            f"shard{'s' if shards != 1 else ''} ({s['bytes'] / 2**20:,.1f} MiB), "
            f"{s['src_tokens']:,} source and {s['tgt_tokens']:,} target tokens; "
            f"{s['dropped_too_long']:,} pairs longer than "
            f"max_length={s['max_length']} are dropped")
