"""Decoding speed: beam search (or greedy with --beam 1) of a preset with random weights.

    python benchmarks/decode.py --preset base [--batch 32 --src-len 30 --out-len 30 --beam 4]

Every hypothesis is forced to exactly `out-len` tokens (EOS is masked before and forced at the
last position), so runs are comparable whatever the weights. Prints one JSON line;
target_tokens_per_s counts the batch x out-len output tokens (the returned translations), not
the beam x batch x out-len tokens scored along the way.
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import emit  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer import Transformer  # noqa: E402
from keras_transformer.decoding.beam_search import beam_search  # noqa: E402
from keras_transformer.decoding.search import greedy_search, model_step  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--src-len", type=int, default=30)
    parser.add_argument("--out-len", type=int, default=30)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=37000)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs (median reported)")
    parser.add_argument("--xla", action="store_true", help="compile the search with XLA")
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(0)
    model = Transformer.from_preset(args.preset, vocab_size=args.vocab_size)
    model.build()
    rng = np.random.default_rng(0)
    source = rng.integers(4, args.vocab_size, (args.batch, args.src_len)).astype("int32")
    source[:, -1] = 2  # EOS

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)],
                 jit_compile=args.xla or None)
    def search(source_ids):
        limits = tf.fill([tf.shape(source_ids)[0]], args.out_len)
        step_fn, state, limits, steps = model_step(model, source_ids, args.beam, args.out_len,
                                                   limits=limits)
        if args.beam == 1:
            return greedy_search(step_fn, state, limits, steps, min_length=args.out_len)[0]
        return beam_search(step_fn, state, limits, args.beam, 0.6, steps,
                           min_length=args.out_len)["ids"][:, 0]

    ids = search(source).numpy()  # trace and warm up
    assert ids.shape[1] == args.out_len and np.all(ids[:, -1] == 2), "length not forced"
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        search(source).numpy()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    emit({
        "benchmark": "decode",
        "preset": args.preset,
        "search": "greedy" if args.beam == 1 else "beam",
        "beam": args.beam,
        "batch": args.batch,
        "src_len": args.src_len,
        "out_len": args.out_len,
        "vocab_size": args.vocab_size,
        "xla": args.xla,
        "seconds": round(seconds, 3),
        "target_tokens_per_s": round(args.batch * args.out_len / seconds, 1),
        "sentences_per_s": round(args.batch / seconds, 2),
    })


if __name__ == "__main__":
    main()
