import numpy as np
import pytest
import tensorflow as tf

from pipelines import batching
from pipelines.special_ids import BOS_ID, EOS_ID, PAD_ID


def random_pairs(n=3000, seed=0, max_len=60):
    rng = np.random.default_rng(seed)
    pairs = []
    for i in range(n):
        length = int(rng.integers(1, max_len))
        other = max(1, int(length * rng.uniform(0.6, 1.5)))
        # Token ids encode the pair index so we can check every pair comes out exactly once.
        pairs.append(([10 + i] + [5] * (length - 1), [10 + i] + [6] * (other - 1)))
    return pairs


def as_dataset(pairs):
    return tf.data.Dataset.from_generator(
        lambda: iter(pairs),
        output_signature=(tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32)),
    )


@pytest.mark.parametrize("pad_to_bucket", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_every_batch_fits_the_budget_on_both_sides(pad_to_bucket):
    budget, max_length = 600, 100
    pairs = random_pairs()
    step = batching.bucket_by_length(budget, max_length, pad_to_bucket=pad_to_bucket, seed=3,
                                     pool_size=1000)
    seen, real, total = [], 0, 0
    bounds = set(batching.geometric_boundaries(max_length))
    for src, tgt in as_dataset(pairs).apply(step).as_numpy_iterator():
        assert src.size <= budget and tgt.size <= budget
        assert src.shape[0] == tgt.shape[0]
        if pad_to_bucket:
            assert src.shape[1] in bounds and tgt.shape[1] in bounds
            assert src.shape[0] == budget // max(src.shape[1], tgt.shape[1])
        rows = src[:, 0] != PAD_ID
        seen += list(src[rows, 0])
        np.testing.assert_array_equal(src[rows, 0], tgt[rows, 0])  # pairs stay together
        real += (src != PAD_ID).sum() + (tgt != PAD_ID).sum()
        total += src.size + tgt.size
    assert sorted(seen) == [10 + i for i in range(len(pairs))]
    assert real / total > 0.8


@pytest.mark.parametrize("pad_to_bucket", [False, True])
def test_tf_data_bucketing_cuts_the_batches_the_plan_cuts(pad_to_bucket):
    """The tf.data step and the prepared data's plan (here its dev batches) group the same
    pairs into batches of the same padded shapes, given the same lengths."""
    from pipelines.prepared import batches_of_pairs

    budget, max_length = 600, 100
    ids = [(s, t) for s, t in random_pairs(1500, seed=2, max_len=99)
           if len(s) + 1 <= max_length and len(t) + 2 <= max_length]
    with_specials = [(s + [EOS_ID], [BOS_ID] + t + [EOS_ID]) for s, t in ids]
    step = batching.bucket_by_length(budget, max_length, pad_to_bucket=pad_to_bucket,
                                     pool_size=len(ids), shuffle_buffer=0)  # one pool, in order
    cut_by_tf = list(as_dataset(with_specials).apply(step).as_numpy_iterator())
    planned, left_out = batches_of_pairs([s for s, _ in ids], [t for _, t in ids], budget,
                                         max_length, pad_to_bucket=pad_to_bucket)
    assert left_out == 0 and len(planned) == len(cut_by_tf) > 20
    for (src, tgt), ((plan_src, plan_tgt_in), plan_labels) in zip(cut_by_tf, planned):
        np.testing.assert_array_equal(src, plan_src)
        np.testing.assert_array_equal(tgt, np.concatenate([plan_tgt_in, plan_labels[:, -1:]], 1))


def test_boundaries_are_geometric():
    bounds = batching.geometric_boundaries(256, min_boundary=8, growth=1.1)
    assert bounds[0] == 8 and bounds[-1] == 256
    ratios = np.array(bounds[1:]) / np.array(bounds[:-1])
    assert np.all(ratios >= 1.0) and np.all(ratios[bounds[:-1].index(20):] <= 1.15)
    with pytest.raises(ValueError, match="growth=1.0"):
        batching.geometric_boundaries(256, growth=1.0)
    with pytest.raises(ValueError, match="tokens_per_batch=100 cannot hold"):
        batching.bucket_by_length(100, max_length=256)


def test_over_long_pairs_are_dropped_and_counted_never_truncated():
    pairs = [([7] * 5, [8] * 5), ([7] * 12, [8] * 3), ([7] * 3, [8] * 11), ([7] * 10, [8] * 10)]
    dataset = as_dataset(pairs)
    kept = list(dataset.apply(batching.filter_by_length(10)).as_numpy_iterator())
    assert [(len(s), len(t)) for s, t in kept] == [(5, 5), (10, 10)]
    counts = batching.count_lengths(dataset, max_length=10)
    assert counts == {"pairs": 4, "too_long": 2, "src_tokens": 30, "tgt_tokens": 29}


class CharTokenizer:
    """Stand-in vocabulary for pipeline-shape tests: one id per byte (not the project's model)."""

    def tokenize(self, texts):
        return tf.strings.unicode_decode(texts, "UTF-8") % 200 + 4


def test_make_dataset_shifts_targets_and_is_seeded():
    texts = [(f"source {i}", f"target number {i}") for i in range(200)]
    pairs = tf.data.Dataset.from_tensor_slices(([s for s, _ in texts], [t for _, t in texts]))

    def batches(seed):
        dataset = batching.make_dataset(pairs, CharTokenizer(), tokens_per_batch=256,
                                        max_length=40, seed=seed)
        return list(dataset.as_numpy_iterator())

    first = batches(seed=5)
    (src, decoder_in), labels = first[0]
    assert np.all(decoder_in[:, 0] == BOS_ID)
    np.testing.assert_array_equal(decoder_in[:, 1:], labels[:, :-1])
    assert np.all(np.sum(labels == EOS_ID, axis=1) == 1)
    assert np.all(np.sum(src == EOS_ID, axis=1) == 1)
    assert sum(len(b[1]) for b in first) == 200
    again = batches(seed=5)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(first, again))
    other = batches(seed=6)
    assert not all(np.array_equal(a[1], b[1]) for a, b in zip(first, other))


def test_repeated_data_never_puts_one_pair_twice_in_a_batch():
    # 200 distinct pairs, a sorting pool of 8 x 256 sentences: a pool spanning passes would
    # hold about ten copies of each pair, side by side after sorting.
    texts = [(f"source {i}", f"target number {i}") for i in range(200)]
    pairs = tf.data.Dataset.from_tensor_slices(([s for s, _ in texts], [t for _, t in texts]))
    dataset = batching.make_dataset(pairs, CharTokenizer(), tokens_per_batch=256, max_length=40,
                                    seed=1, repeat=True)
    seen = 0
    for (src, _), _ in dataset.take(60).as_numpy_iterator():
        rows = [tuple(row) for row in src]
        assert len(set(rows)) == len(rows)
        seen += len(rows)
    assert seen > 400  # more than two passes


@pytest.mark.slow
def test_multi30k_train_meets_the_batching_targets(shared_data, tmp_path):
    from pipelines import sources
    from pipelines.tokenizer import train_tokenizer

    folder = shared_data / "multi30k"
    pairs, _ = sources.parallel_text(folder / "train.en.gz", folder / "train.de.gz", check=False)
    # The tokenizer learns from the same pairs read in plain Python (the dataset's 58,000
    # strings stepped through eagerly cost 5-6 CPU-s; the batching below is what is checked).
    src_texts, tgt_texts = sources.read_parallel_text(folder / "train.en.gz",
                                                      folder / "train.de.gz")
    tokenizer = train_tokenizer(src_texts + tgt_texts, 8000, progress=False)
    budget = 4096
    dataset = batching.make_dataset(pairs, tokenizer, tokens_per_batch=budget, seed=0)
    real = total = 0
    fuller = []
    for (src, _), labels in dataset.as_numpy_iterator():
        tgt_size = labels.shape[0] * (labels.shape[1] + 1)
        assert src.size <= budget and tgt_size <= budget
        real += (src != 0).sum() + (labels != 0).sum() + (labels != 0).any(axis=1).sum()
        total += src.size + tgt_size
        fuller.append(max(src.size, tgt_size))
    assert real / total >= 0.90
    assert np.mean(fuller) >= 0.85 * budget
