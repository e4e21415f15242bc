"""Constrained vs unconstrained beam search, beam 4, on the same batch (CPU, TensorFlow).

Random weights of a preset (they rarely end early: both searches run to their limit, the
constrained one 4 steps more for its two 2-token phrases), a tf.function and, with --xla, the
XLA-compiled search. Prints milliseconds per batch (median of --repeats after a first call that
traces/compiles) and the ratio.

    .venv/bin/python benchmarks/constraints_speed.py --preset small --batch 16 --length 16
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from keras_transformer import Transformer  # noqa: E402
from keras_transformer.decoding.search.beam_search import compiled_beam_search  # noqa: E402
from pipelines.special_ids import EOS_ID  # noqa: E402


def median_ms(run, repeats):
    run()  # traces / compiles
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.asarray(run()["ids"])
        times.append(time.perf_counter() - start)
    return 1000 * float(np.median(times))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--xla", action="store_true")
    args = parser.parse_args()

    model = Transformer.from_preset(args.preset, vocab_size=args.vocab, dropout=0.0)
    model.build()
    rng = np.random.default_rng(0)
    source = rng.integers(4, args.vocab, (args.batch, args.length)).astype(np.int32)
    source[:, -1] = EOS_ID
    constraints = rng.integers(4, args.vocab, (args.batch, 2, 2)).astype(np.int32)
    plain = compiled_beam_search(model, 4, jit_compile=args.xla)
    constrained = compiled_beam_search(model, 4, jit_compile=args.xla, with_constraints=True)
    plain_ms = median_ms(lambda: plain(source), args.repeats)
    constrained_ms = median_ms(lambda: constrained(source, constraints), args.repeats)
    print(f"{args.preset} vocab {args.vocab} batch {args.batch}x{args.length} "
          f"{'XLA' if args.xla else 'graph'}: beam 4 {plain_ms:.0f} ms, with 2 phrases of 2 "
          f"tokens {constrained_ms:.0f} ms ({constrained_ms / plain_ms:.2f}x; "
          f"{args.length + 50} vs {args.length + 54} steps)")


if __name__ == "__main__":
    main()
