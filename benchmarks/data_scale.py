"""The training data path at WMT scale: prepare once, start and resume in seconds, feed fast.

    python benchmarks/data_scale.py [--pairs 4500000] [--vocab-size 32000]

In a temporary folder: writes a synthetic parallel corpus of `--pairs` pairs (WMT14 en-de has
4.5M) by recombining the sentence pairs of ../shared/data/newstest (each synthetic pair joins the
head of one real pair to the tail of another, both sides cut at the same fraction of their
words, so lengths follow the news test sets' distribution), prepares it as `train` does
(`pipelines.datasets.prepare_training_data`), builds the base model, then times the reader as
training builds it (`pipelines.prepared.training_dataset`) and prints one JSON line:

  prepare_s             vocabulary sample + sentencepiece training + tokenizing + writing
  prepared_mb           size of the shards
  first_batch_s         building the input pipeline (shard checks, batch plan) to the first batch
  resume_first_batch_s  the same from the data position of step 100,000 (grad_accum 1)
  tokens_per_s          real (non-padding) source + target tokens of batches of
                        --tokens-per-batch per side, consumed as fast as possible for --seconds
  raw_text_tokens_per_s the raw-text pipeline (`pipelines.batching.make_dataset`: read,
                        tokenize, filter, shuffle, bucket) over the first --raw-pairs pairs,
                        same budget, one whole pass (its sorting pool is 8 x the budget in
                        sentences, 200,000 at 25,000 tokens: a shorter window would time the
                        filling of the first pool only), measured in the same run
  padding_efficiency    real tokens / all tokens (padding included, both sides) of the
                        prepared stream
  peak_rss_mb           the process's peak resident memory
"""

import argparse
import os
import pathlib
import random
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tf_common  # noqa: E402,F401  (first: sets Keras' backend, quiets TensorFlow)
from common import emit  # noqa: E402

NEWSTEST = pathlib.Path(__file__).resolve().parents[1].parent / "shared/data/newstest"


def write_corpus(folder, pairs, seed=0, newstest=NEWSTEST):
    """Synthetic en-de pairs recombined from newstest2013/2014: (source file, target file)."""
    real = []
    for year in ("2013", "2014"):
        en = (newstest / f"newstest{year}.en-de.en").read_text(encoding="utf-8").splitlines()
        de = (newstest / f"newstest{year}.en-de.de").read_text(encoding="utf-8").splitlines()
        real += [(s.split(), t.split()) for s, t in zip(en, de) if s.strip() and t.strip()]
    rng = random.Random(seed)
    src_path, tgt_path = folder / "train.en", folder / "train.de"
    with open(src_path, "w", encoding="utf-8") as src, open(tgt_path, "w", encoding="utf-8") as tgt:
        for _ in range(pairs):
            (s1, t1), (s2, t2) = rng.choice(real), rng.choice(real)
            cut = rng.random()
            source = s1[:round(cut * len(s1))] + s2[round(cut * len(s2)):]
            target = t1[:round(cut * len(t1))] + t2[round(cut * len(t2)):]
            src.write(" ".join(source or s1) + "\n")
            tgt.write(" ".join(target or t1) + "\n")
    return src_path, tgt_path


def count(batch):
    """(real tokens, all tokens) of ((source, decoder input), labels), both sides; the target
    is [BOS] y [EOS]: labels hold y [EOS], plus one BOS per real row."""
    (src, _), labels = batch
    real = int((src != 0).sum() + (labels != 0).sum() + (labels != 0).any(axis=1).sum())
    return real, src.size + labels.shape[0] * (labels.shape[1] + 1)


def consume(iterator, seconds=None):
    """Pulls batches for `seconds` (None: to the end): (batches, real tokens, all tokens,
    seconds taken)."""
    batches = real = total = 0
    start = time.perf_counter()
    while seconds is None or time.perf_counter() - start < seconds:
        batch = next(iterator, None)
        if batch is None:
            break
        r, t = count(batch)
        batches, real, total = batches + 1, real + r, total + t
    return batches, real, total, time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=4_500_000,
                        help="synthetic corpus size (default 4,500,000: WMT14 en-de)")
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--vocab-sample", type=int, default=500_000,
                        help="sentences the vocabulary is trained on (default 500,000)")
    parser.add_argument("--tokens-per-batch", type=int, default=25000,
                        help="token budget per side (default 25000, the paper's)")
    parser.add_argument("--shard-pairs", type=int, default=None,
                        help="source pairs per shard (default: prepare's)")
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="how long each throughput is measured (default 30)")
    parser.add_argument("--raw-pairs", type=int, default=400_000,
                        help="pairs of the corpus the raw-text pipeline reads, all of them "
                             "(default 400,000: two of its sorting pools)")
    parser.add_argument("--resume-step", type=int, default=100_000)
    parser.add_argument("--preset", default="base", help="the model built before timing")
    parser.add_argument("--keep", help="work in this folder and keep it (default: a temporary "
                                       "folder, deleted)")
    args = parser.parse_args(argv)

    import tensorflow as tf

    from keras_transformer import Transformer
    from pipelines import datasets, prepared, sources
    from pipelines.batching import make_dataset
    from pipelines.tokenizer import SubwordTokenizer

    with tempfile.TemporaryDirectory() as temporary:
        folder = pathlib.Path(args.keep or temporary)
        folder.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        src_file, tgt_file = write_corpus(folder, args.pairs)
        generate_s = time.perf_counter() - started

        started = time.perf_counter()
        data = datasets.prepare_training_data(
            "text", "en", "de", cache_dir=folder / "cache", vocab_size=args.vocab_size,
            vocabulary_sample=args.vocab_sample, shard_pairs=args.shard_pairs, progress=False,
            text_files={"train": (str(src_file), str(tgt_file))})
        prepare_s = time.perf_counter() - started
        tokenizer = SubwordTokenizer.load(data.tokenizer_path)

        model = Transformer.from_preset(args.preset, vocab_size=tokenizer.vocab_size)
        model.build()

        def first_batch(start):
            began = time.perf_counter()
            _, dataset = prepared.training_dataset(data, args.tokens_per_batch, start=start)
            iterator = dataset.as_numpy_iterator()
            batch = next(iterator)
            return time.perf_counter() - began, iterator, batch

        first_batch_s, iterator, _ = first_batch(0)
        del iterator
        resume_s, iterator, _ = first_batch(args.resume_step)
        batches, real, total, seconds = consume(iterator, args.seconds)
        del iterator

        pairs, _ = sources.parallel_text(src_file, tgt_file, check=False)
        raw = make_dataset(pairs.take(args.raw_pairs), tokenizer, args.tokens_per_batch,
                           shuffle=True, seed=0)
        raw_batches, raw_real, _, raw_seconds = consume(raw.as_numpy_iterator())

        statistics = data.statistics
        emit({
            "benchmark": "data_scale",
            "pairs": statistics["pairs"],
            "shards": len(data.shards),
            "vocab_size": statistics["vocab_size"],
            "tokens_per_batch": args.tokens_per_batch,
            "generate_s": round(generate_s, 1),
            "prepare_s": round(prepare_s, 1),
            "prepared_mb": round(statistics["bytes"] / 2**20, 1),
            "first_batch_s": round(first_batch_s, 2),
            "resume_step": args.resume_step,
            "resume_first_batch_s": round(resume_s, 2),
            "batches": batches,
            "tokens_per_s": round(real / seconds, 1),
            "raw_text_batches": raw_batches,
            "raw_text_tokens_per_s": round(raw_real / raw_seconds, 1),
            "speedup": round((real / seconds) / max(raw_real / raw_seconds, 1e-9), 2),
            "padding_efficiency": round(real / max(total, 1), 4),
            "cpu_count": os.cpu_count(),
            "tensorflow": tf.__version__,
        })


if __name__ == "__main__":
    main()
