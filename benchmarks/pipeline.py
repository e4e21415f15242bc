"""Input-pipeline speed and batch quality over Multi30k train (en-de).

    python benchmarks/pipeline.py [--tokens-per-batch 4096] [--pad-to-bucket]

Takes the 8000-piece vocabulary of the prepared Multi30k data (preparing it once), then times
one full pass of the pipeline (read -> tokenize -> filter -> bucket -> shift) and prints one JSON
line.
padding_efficiency = real tokens / all tokens (both sides, padding included);
mean/max_tokens_per_batch count the padded tokens of a batch's fuller side, the quantity the
budget bounds; mean_real_tokens_per_batch is the real tokens of one side, averaged over sides.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tf_common  # noqa: E402,F401  (first: sets Keras' backend, quiets TensorFlow)
from common import MULTI30K_VOCAB_SIZE, emit  # noqa: E402

import numpy as np  # noqa: E402

from keras_transformer.defaults import MAX_LENGTH  # noqa: E402
from pipelines import datasets, sources  # noqa: E402
from pipelines.batching import make_dataset  # noqa: E402
from pipelines.tokenizer import SubwordTokenizer  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens-per-batch", type=int, default=4096)
    parser.add_argument("--max-length", type=int, default=MAX_LENGTH)
    parser.add_argument("--pad-to-bucket", action="store_true")
    parser.add_argument("--vocab-size", type=int, default=MULTI30K_VOCAB_SIZE)
    parser.add_argument("--data-dir", default=None, help="Multi30k raw files (default: shared)")
    args = parser.parse_args(argv)

    data_dir = args.data_dir or sources.default_multi30k_dir()
    if data_dir is None:
        sys.exit("Multi30k not found: pass --data-dir or set MULTI30K_DIR.")
    src_file, tgt_file = (os.path.join(data_dir, f"train.{lang}.gz") for lang in ("en", "de"))
    pairs, stats = sources.parallel_text(src_file, tgt_file, check=False)
    # The vocabulary training would use: that of the prepared data (prepared once, cached).
    data = datasets.prepare_training_data("multi30k", "en", "de", vocab_size=args.vocab_size,
                                          source_dir=data_dir, progress=False)
    tokenizer = SubwordTokenizer.load(data.tokenizer_path)

    start = time.perf_counter()
    dataset = make_dataset(pairs, tokenizer, args.tokens_per_batch, args.max_length,
                           shuffle=True, seed=0, pad_to_bucket=args.pad_to_bucket)
    batches = sentences = real = total = real_sides = 0
    fuller = []
    for (src, _), labels in dataset.as_numpy_iterator():
        # The target side is [BOS] y [EOS]: labels hold y [EOS], plus one BOS per real row.
        tgt_real = int((labels != 0).sum() + (labels != 0).any(axis=1).sum())
        src_real = int((src != 0).sum())
        tgt_padded = labels.shape[0] * (labels.shape[1] + 1)
        batches += 1
        sentences += int((src != 0).any(axis=1).sum())
        real += src_real + tgt_real
        total += src.size + tgt_padded
        real_sides += (src_real + tgt_real) / 2
        fuller.append(max(src.size, tgt_padded))
    seconds = time.perf_counter() - start
    emit({
        "benchmark": "pipeline",
        "dataset": "multi30k train en-de",
        "tokens_per_batch": args.tokens_per_batch,
        "pad_to_bucket": args.pad_to_bucket,
        "batches": batches,
        "sentences": sentences,
        "seconds": round(seconds, 2),
        "sentences_per_s": round(sentences / seconds, 1),
        "tokens_per_s": round(real / seconds, 1),
        "padding_efficiency": round(real / total, 4),
        "mean_tokens_per_batch": round(float(np.mean(fuller)), 1),
        "max_tokens_per_batch": int(max(fuller)),
        "mean_real_tokens_per_batch": round(real_sides / batches, 1),
    })


if __name__ == "__main__":
    main()
