"""Matrix-multiply rates of a search's own shapes: how fast this machine's TensorFlow kernels
(plain graph and XLA) and OpenBLAS (through NumPy) multiply the batch x beam rows of one
decoding step by each of the decoder's weight matrices.

    python benchmarks/gemm.py --preset base                         # batch 32, beam 4: 128 rows
    python benchmarks/gemm.py --preset base --batch 1 --beam 4      # the one-request case

A step multiplies `rows` vectors by the fused self-attention QKV (d x 3d), the attention
outputs and cross-attention queries (d x d), the feed-forward pair (d x d_ff, d_ff x d) and the
output projection (d x vocab). Each shape is timed with as many distinct matrices as
a step uses (the weights stream from memory as in a real step), all products in one call. For
each library the JSON gives GFLOP/s per shape and `step_matmul_ms`, the time one decoding
step's matmuls take at those rates (every layer, the output projection once): a floor under
the step time of any engine that uses that library.
`tensorflow_transposed` computes the same product as (W^T x^T)^T with W^T stored (out x in), the
order and layout of our decoding steps' output projection (`ScaledEmbedding.step_logits`). Compare
with `benchmarks/decode.py`, whose `achieved_gflops` divides the same work by whole searches.
`tensorflow_matmul_peak_gflops` and `openblas_matmul_peak_gflops` are each library's rate on
large square matrices (2048^3, 4096^3), measured in the same run.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# tf_common first: it sets Keras' backend (TensorFlow) and quiets TensorFlow before they load.
from tf_common import measure_matmul_peak  # noqa: E402
from common import PAPER_VOCAB_SIZE, emit  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer.models.presets import PRESETS  # noqa: E402


def rate(function, flops, seconds=1.0):
    """GFLOP/s of `function()` repeated for about `seconds` after one warm-up call."""
    function()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        function()
        calls += 1
    return flops * calls / (time.perf_counter() - start) / 1e9


def tensorflow_products(order, jit_compile=None):
    """A tf.function multiplying x by every matrix of a list in one call (no Python between
    the products): `plain` x W with W stored (in, out); `transposed` (W^T x^T)^T with W^T
    stored (out, in). Returns the sum of the first output column, to force them all."""
    def products(x, weights):
        if order == "plain":
            outputs = [tf.linalg.matmul(x, w) for w in weights]
        else:
            outputs = [tf.transpose(tf.linalg.matmul(w, x, transpose_b=True)) for w in weights]
        return tf.add_n([o[:, 0] for o in outputs])
    return tf.function(products, jit_compile=jit_compile)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=PAPER_VOCAB_SIZE)
    args = parser.parse_args(argv)
    arch = PRESETS[args.preset]["model"]
    d, d_ff, layers = arch["d_model"], arch["d_ff"], arch["num_layers"]
    rows = args.batch * args.beam
    # (name, inner, outer, uses per step)
    shapes = [("qkv", d, 3 * d, layers), ("d_x_d", d, d, 3 * layers),
              ("ffn_in", d, d_ff, layers), ("ffn_out", d_ff, d, layers),
              ("logits", d, args.vocab_size, 1)]
    rng = np.random.default_rng(0)
    x = {inner: rng.standard_normal((rows, inner), dtype=np.float32) for inner in (d, d_ff)}
    # As many distinct matrices of each shape as a step uses, so that the weights stream from
    # memory as they do in a real step (one matrix would stay in the cache).
    weights = {name: [rng.standard_normal((inner, outer), dtype=np.float32) for _ in range(uses)]
               for name, inner, outer, uses in shapes}
    flops = {name: 2 * rows * inner * outer * uses for name, inner, outer, uses in shapes}
    variants = {"tensorflow": ("plain", None), "tensorflow_transposed": ("transposed", None),
                "tensorflow_xla": ("plain", True)}
    libraries = {name: {} for name in (*variants, "openblas")}
    for name, inner, _, _ in shapes:
        tx = tf.constant(x[inner])
        for library, (order, jit) in variants.items():
            mats = [tf.constant(w if order == "plain" else np.ascontiguousarray(w.T))
                    for w in weights[name]]
            function = tensorflow_products(order, jit)
            libraries[library][name] = rate(lambda: function(tx, mats).numpy(), flops[name])
        libraries["openblas"][name] = rate(lambda: [x[inner] @ w for w in weights[name]],
                                           flops[name])
    record = {"benchmark": "gemm", "preset": args.preset, "rows": rows,
              "vocab_size": args.vocab_size,
              "tensorflow_matmul_peak_gflops": round(measure_matmul_peak(), 1)}
    square = rng.standard_normal((2048, 2048), dtype=np.float32)
    record["openblas_matmul_peak_gflops"] = round(rate(lambda: square @ square, 2 * 2048**3), 1)
    for library, rates in libraries.items():
        step_s = sum(flops[name] / (rates[name] * 1e9) for name in rates)
        record[library] = {"gflops": {k: round(v, 1) for k, v in rates.items()},
                           "step_matmul_ms": round(step_s * 1e3, 2)}
    emit(record)


if __name__ == "__main__":
    main()
