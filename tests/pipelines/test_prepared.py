"""Prepared training data: shards and statistics, the cache, the batch stream and its
positions, file sharding per worker, damaged shards, a killed prepare."""

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from pipelines import datasets, prepared
from pipelines.errors import DataError
from pipelines.tokenizer import SubwordTokenizer

SHARD_PAIRS = 50  # the toy corpus's 360 training pairs make 8 shards


def prepare_toy(corpus, cache, **kwargs):
    return datasets.prepare_training_data(
        "text", "en", "de", cache_dir=cache, vocab_size=400, max_length=32,
        shard_pairs=SHARD_PAIRS, progress=False,
        text_files={"train": (str(corpus["train.src"]), str(corpus["train.tgt"]))}, **kwargs)


@pytest.fixture(scope="module")
def toy_data(tmp_path_factory, toy_corpus):
    return prepare_toy(toy_corpus, tmp_path_factory.mktemp("cache"))


def lines(path):
    return path.read_text(encoding="utf-8").splitlines()


def test_shards_hold_the_tokenizers_ids_and_the_statistics_add_up(toy_data, toy_corpus):
    stats = toy_data.statistics
    assert len(toy_data.shards) == 8 and stats["read"] == 360
    assert stats["pairs"] + stats["dropped_too_long"] == 360 and stats["pairs"] > 300
    tokenizer = SubwordTokenizer.load(toy_data.tokenizer_path)
    src, tgt = lines(toy_corpus["train.src"]), lines(toy_corpus["train.tgt"])
    for index in (0, 7):
        arrays = toy_data.load(index)
        first = index * SHARD_PAIRS
        chunk_src, chunk_tgt = src[first:first + SHARD_PAIRS], tgt[first:first + SHARD_PAIRS]
        ids_src = tokenizer.tokenize(chunk_src)
        ids_tgt = tokenizer.tokenize(chunk_tgt)
        keep = (ids_src.row_lengths().numpy() + 1 <= 32) & (ids_tgt.row_lengths().numpy() + 2 <= 32)
        np.testing.assert_array_equal(arrays["src_len"], ids_src.row_lengths().numpy()[keep])
        np.testing.assert_array_equal(arrays["src_ids"],
                                      np.concatenate(ids_src.numpy()[keep]))
        np.testing.assert_array_equal(arrays["tgt_ids"],
                                      np.concatenate(ids_tgt.numpy()[keep]))
    total_src = sum(int(toy_data.load(i)["src_len"].sum()) for i in range(8))
    assert stats["src_tokens"] == total_src + stats["pairs"]  # + EOS per pair


def test_the_cache_is_reused_and_keyed_by_settings(toy_data, toy_corpus):
    mtime = (toy_data.directory / prepared.STATISTICS).stat().st_mtime_ns
    cache = toy_data.directory.parent
    again = prepare_toy(toy_corpus, cache)
    assert again.directory == toy_data.directory
    assert (again.directory / prepared.STATISTICS).stat().st_mtime_ns == mtime
    # The vocabulary it was made with, given as a run's own, finds the same data.
    same = prepare_toy(toy_corpus, cache, vocabulary=toy_data.tokenizer_path.read_bytes())
    assert same.directory == toy_data.directory
    other = datasets.prepare_training_data(
        "text", "en", "de", cache_dir=cache, vocab_size=400, max_length=20,
        shard_pairs=SHARD_PAIRS, progress=False,
        text_files={"train": (str(toy_corpus["train.src"]), str(toy_corpus["train.tgt"]))})
    assert other.directory != toy_data.directory


def rows(batch):
    (src, _), labels = batch
    return [tuple(int(i) for i in row[row != 0]) for row in src]


def shard_rows(data, indices):
    """The source rows (ids + EOS) of the given shards, sorted."""
    found = []
    for index in indices:
        arrays = data.load(index)
        offsets = np.concatenate([[0], np.cumsum(arrays["src_len"].astype(np.int64))])
        found += [tuple(int(i) for i in arrays["src_ids"][a:b]) + (2,)
                  for a, b in zip(offsets, offsets[1:])]
    return sorted(found)


def epoch_rows(plan, epoch=0):
    per_epoch = plan.batches_per_epoch
    return sorted(r for batch in plan.batches(epoch * per_epoch, (epoch + 1) * per_epoch)
                  for r in rows(batch))


def test_the_stream_resumes_at_any_batch_and_each_epoch_holds_every_pair(toy_data):
    plan = prepared.BatchPlan(toy_data, 256, 32, seed=7)
    per_epoch = plan.batches_per_epoch
    full = list(plan.batches(0, 2 * per_epoch + 10))
    for start in (0, 3, per_epoch - 1, per_epoch, 2 * per_epoch + 2):
        tail = list(plan.batches(start, start + 8))
        assert len(tail) == min(8, len(full) - start)
        for a, b in zip(tail, full[start:]):
            for x, y in zip(a[0] + (a[1],), b[0] + (b[1],)):
                np.testing.assert_array_equal(x, y)
    assert epoch_rows(plan, 0) == epoch_rows(plan, 1) == shard_rows(toy_data, range(8))
    assert rows(full[0]) != rows(full[per_epoch])  # each epoch in its own order
    for (src, tgt_in), labels in full:
        assert src.size <= 256 and labels.shape[0] * (labels.shape[1] + 1) <= 256
        assert (tgt_in[:, 0] == 1).all() and (src[np.arange(len(src)), (src != 0).sum(1) - 1]
                                              == 2).all()


def test_pad_to_bucket_gives_shapes_from_the_bucket_table(toy_data):
    plan = prepared.BatchPlan(toy_data, 256, 32, seed=7, pad_to_bucket=True)
    bounds = set(plan.bounds.tolist())
    for (src, tgt_in), labels in plan.batches(0, plan.batches_per_epoch):
        assert src.shape[1] in bounds and tgt_in.shape[1] + 1 in bounds
        assert src.shape[0] == 256 // max(src.shape[1], tgt_in.shape[1] + 1)


def test_fixed_shapes_for_xla_pad_the_same_batches(toy_data):
    plain = prepared.BatchPlan(toy_data, 256, 32, seed=7, pad_to_bucket=True)
    fixed = prepared.BatchPlan(toy_data, 256, 32, seed=7, pad_to_bucket=True, devices=2)
    bounds, shapes = plain.bounds.tolist(), set()
    for before, after in zip(plain.batches(0, plain.batches_per_epoch),
                             fixed.batches(0, plain.batches_per_epoch)):
        (src, tgt_in), labels = after
        assert src.shape == tgt_in.shape == labels.shape and src.shape[1] in bounds
        assert src.shape[0] % 2 == 0
        shapes.add(src.shape)
        for small, padded in zip(before[0] + (before[1],), after[0] + (after[1],)):
            rows, width = small.shape
            np.testing.assert_array_equal(padded[:rows, :width], small)
            assert not padded[rows:].any() and not padded[:, width:].any()
    assert len(shapes) <= len(bounds)


def test_static_shapes_pad_the_same_batches_to_a_few_coarse_cells(toy_data):
    """What JAX trains on by default (`pad_to_bucket` on): the batches of the plain plan, each
    padded to the fixed shape of its coarse cell (8, 12, 16, 24, 32 at max_length 32)."""
    from pipelines import buckets

    plain = prepared.BatchPlan(toy_data, 256, 32, seed=7)
    fine = prepared.BatchPlan(toy_data, 256, 32, seed=7, devices=1)
    static = prepared.BatchPlan(toy_data, 256, 32, seed=7, static=True)
    cells = buckets.static_boundaries(32)
    assert cells == [8, 12, 16, 24, 32]
    fine_shapes, static_shapes = set(), set()
    for before, fixed, after in zip(plain.batches(0, plain.batches_per_epoch),
                                    fine.batches(0, plain.batches_per_epoch),
                                    static.batches(0, plain.batches_per_epoch)):
        (src, tgt_in), labels = after
        assert src.shape == tgt_in.shape == labels.shape and src.shape[1] in cells
        below = max([0] + [c for c in cells if c < src.shape[1]])
        assert src.shape[0] == 256 // (below + 1)  # the most rows a batch of that cell holds
        for small, padded in zip(before[0] + (before[1],), after[0] + (after[1],)):
            rows, width = small.shape
            np.testing.assert_array_equal(padded[:rows, :width], small)
            assert not padded[rows:].any() and not padded[:, width:].any()
        fine_shapes.add(fixed[0][0].shape)
        static_shapes.add(src.shape)
    assert len(static_shapes) <= len(cells) < len(fine_shapes)


def test_workers_read_disjoint_shards(toy_data):
    plans = [prepared.BatchPlan(toy_data, 256, 32, seed=7, worker=w, num_workers=2)
             for w in range(2)]
    assert set(plans[0].shards).isdisjoint(plans[1].shards)
    assert sorted(plans[0].shards + plans[1].shards) == list(range(8))
    for plan in plans:  # each reads exactly the pairs of its own shards
        assert epoch_rows(plan) == shard_rows(toy_data, plan.shards)
    with pytest.raises(DataError, match="fewer than the 9 workers"):
        prepared.BatchPlan(toy_data, 256, 32, worker=0, num_workers=9)


def test_damaged_shards_are_named_before_training_reads_them(toy_data, tmp_path):
    copy = tmp_path / "data"
    shutil.copytree(toy_data.directory, copy)
    data = prepared.PreparedData(copy)
    data.check()
    truncated = data.shard_path(1)
    truncated.write_bytes(truncated.read_bytes()[:-100])
    with pytest.raises(DataError, match=r"shard-00001\.npz is truncated or damaged: \d+ bytes"):
        prepared.training_dataset(data, 256, 32)
    shutil.copy(toy_data.shard_path(1), truncated)
    corrupt = data.shard_path(5)
    content = bytearray(corrupt.read_bytes())
    content[len(content) // 2] ^= 0xFF
    corrupt.write_bytes(bytes(content))
    with pytest.raises(DataError, match=r"shard-00005\.npz is damaged \(its SHA-256 differs"):
        prepared.training_dataset(data, 256, 32)
    corrupt.unlink()
    with pytest.raises(DataError, match=r"shard-00005\.npz is missing"):
        data.check()


def test_prepare_rebuilds_damaged_shards_only(toy_corpus, tmp_path):
    data = prepare_toy(toy_corpus, tmp_path / "cache")
    records = [dict(s) for s in data.shards]
    data.shard_path(3).write_bytes(data.shard_path(3).read_bytes()[:-10])  # truncated
    content = bytearray(data.shard_path(5).read_bytes())
    content[100] ^= 0xFF  # corrupt, same size
    data.shard_path(5).write_bytes(bytes(content))
    untouched = data.shard_path(0).stat().st_mtime_ns
    again = prepare_toy(toy_corpus, tmp_path / "cache")  # sizes are always checked
    assert again.directory == data.directory
    assert again.damaged() == [(5, "is damaged (its SHA-256 differs from the one recorded)")]
    again = prepare_toy(toy_corpus, tmp_path / "cache", verify=True)  # checksums on request
    assert again.damaged() == [] and again.shards == records
    assert again.shard_path(0).stat().st_mtime_ns == untouched


SLOW_PREPARE = textwrap.dedent("""
    import sys, time
    import tensorflow as tf
    from pipelines import prepared

    src, tgt, folder = sys.argv[1:4]
    pairs = list(zip(open(src).read().splitlines(), open(tgt).read().splitlines()))

    def slowly():
        for number, pair in enumerate(pairs):
            if number % 10 == 0:
                time.sleep(0.1)  # about half a second per shard of 50 pairs
            yield pair

    spec = tf.TensorSpec([], tf.string)
    data = tf.data.Dataset.from_generator(slowly, output_signature=(spec, spec))
    prepared.prepare(folder, lambda: data, manifest={"test": "slow"},
                     vocabulary_settings={"vocab_size": 400}, max_length=32, shard_pairs=50,
                     progress=False)
""")


@pytest.mark.slow
def test_a_killed_prepare_keeps_its_finished_shards(toy_corpus, tmp_path):
    import tensorflow as tf

    folder = tmp_path / "data"
    script = tmp_path / "slow_prepare.py"
    script.write_text(SLOW_PREPARE)
    process = subprocess.Popen([sys.executable, str(script), str(toy_corpus["train.src"]),
                                str(toy_corpus["train.tgt"]), str(folder)], cwd=os.getcwd())
    deadline = time.time() + 120
    while len(list(folder.glob("shard-*.json"))) < 3 and time.time() < deadline:
        assert process.poll() is None, "prepare ended before it could be killed"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    finished = {p.name: p.stat().st_mtime_ns for p in folder.glob("shard-*.npz")
                if p.with_suffix(".json").is_file()}
    assert 3 <= len(finished) < 8 and not prepared.PreparedData.is_complete(folder)

    pairs = tf.data.Dataset.zip(tuple(tf.data.TextLineDataset(str(toy_corpus[name]))
                                      for name in ("train.src", "train.tgt")))
    data = prepared.prepare(folder, lambda: pairs, manifest={"test": "slow"},
                            vocabulary_settings={"vocab_size": 400}, max_length=32,
                            shard_pairs=50, progress=False)
    for name, mtime in finished.items():
        assert (folder / name).stat().st_mtime_ns == mtime, f"{name} was written again"
    assert not list(folder.glob(".tmp-*")) and len(data.shards) == 8
    data.check()
    # The same shards as a prepare that was never interrupted.
    fresh = prepared.prepare(tmp_path / "fresh", lambda: pairs, manifest={"test": "slow"},
                             vocabulary=data.tokenizer_path.read_bytes(), max_length=32,
                             shard_pairs=50, progress=False)
    assert [s["sha256"] for s in fresh.shards] == [s["sha256"] for s in data.shards]
