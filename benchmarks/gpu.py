"""Training-step and search speed of our Transformer under JAX, beside PyTorch and KerasHub.

    python benchmarks/gpu.py                                      # everything (a GPU machine)
    python benchmarks/gpu.py --shapes base --dtypes bf16 --engines ours,torch --no-search
    python benchmarks/gpu.py --tiny --steps 2 --warmup 1          # CPU smoke test (jax CPU)

Made for a GPU machine with JAX (CUDA), and optionally PyTorch and KerasHub, and no TensorFlow:
the script blocks `import tensorflow` (a CPU run here behaves as it will there) and runs Keras on
JAX (KERAS_BACKEND defaults to "jax"). Without internet, bring the wheels of keras, namex,
optree (cp312) and keras-hub in a folder .whl (docs/backends.md, "On a GPU machine without
internet", gives the download command),
then, from the repository root:

    python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 benchmarks/gpu.py --engines ours | tee out.jsonl

Training steps, for each shape, dtype and engine (one JSON line each):
    base      the paper's base model, batch 384 x 64 source and 64 target tokens, vocab 37000
    big       the paper's big model, batch 192 x 64, vocab 37000
    multi30k  the multi30k preset, batch 256 x 16, vocab 8000
    tiny      2 layers, d_model 64, 4 heads, d_ff 128, batch 8 x 12, vocab 500 (--tiny)
dtypes: bf16 (Keras "mixed_bfloat16"; PyTorch bf16 autocast) and fp32. Engines:
    ours       keras-transformer's `Transformer`, `model.fit` with jit_compile (engine keras-jax)
    torch      `torch.nn.Transformer` (batch_first, post-norm, relu, same sizes, shared embedding
               tied to the output projection), loss included, under `torch.compile`, fused Adam
    keras-hub  KerasHub's TransformerEncoder/TransformerDecoder, ReversibleEmbedding (tied) and
               SinePositionEncoding in a keras.Model of the same sizes, `model.fit` under JAX
Every engine trains with Adam (beta_2 0.98, epsilon 1e-9, constant learning rate) on sparse
cross-entropy over float32 logits, with the preset's dropout, on random ids in [4, vocab).
ms_per_step is the wall time of --steps optimizer steps after --warmup untimed ones (the first
compiles), divided by --steps; Keras' steps are timed inside one `model.fit` (a Python loop of
`train_on_batch` adds host time per step under JAX).

Our attention takes cuDNN's fused flash kernel where it serves (--attention auto: JAX on a GPU,
bf16); --attention plain times the einsum-and-softmax path instead, for the comparison.

fp32 matmuls run at each framework's default precision unless --fp32-matmul says otherwise
(JAX's documented default on recent GPUs may use TF32; PyTorch's is full float32, "highest"):
--fp32-matmul tf32 or highest sets both; every line records its fp32_matmul_precision.

model_tflop_per_step counts the matrix multiplications the model must do, forward and backward
(3 x forward): 6 x (matmul parameters) x tokens (the encoder's on source tokens, the decoder's
and the output projection's on target tokens, the cross-attention keys and values on source
tokens) plus the attention scores and weighted sums (3 x 2 x heads x (d_k + d_v) per query-key
pair: S x S, T x T and T x S per sentence and layer). Embedding look-ups, softmax, LayerNorm
and the optimizer are not counted. The same count serves every engine, so mfu (model FLOP/s over
the bf16 matmul peak measured in the same run: 8192^3 on a GPU, 512^3 on a CPU) compares them.

Search (--search, the default): our cached greedy search and beam search (beam 4) at batch 32
and batch 1, jit-compiled, for each shape and dtype, on random source ids as long as the shape's
length; the output may be as long as the source (extra_length=0: EOS is forced there; random
weights rarely end earlier). target_tokens_per_s counts the tokens returned (best hypothesis).
A part that cannot run here prints {"skipped": reason} and the rest goes on; a measurement that
fails prints its "error" and the script exits with status 1 at the end.
"""

import argparse
import dataclasses
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
# JAX otherwise takes 75% of the GPU's memory at its first operation; PyTorch shares the process.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# This folder (common, flops, gpu_engines, gpu_search) and the repository root (keras_transformer
# is not installed on the GPU machine).
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.dirname(_HERE)]

# Make `import tensorflow` fail as on a machine without it (None in sys.modules: the import
# raises ModuleNotFoundError, importlib.util.find_spec answers None), unless something has
# imported it already.
for _name in ("tensorflow", "tensorflow_text"):
    sys.modules.setdefault(_name, None)

import numpy as np  # noqa: E402

from common import (MULTI30K_VOCAB_SIZE, PAPER_VOCAB_SIZE, Report, csv_choice,  # noqa: E402
                    csv_ints, sig)
from flops import train_step_flops  # noqa: E402
from gpu_engines import ENGINES, FP32_MATMUL, jax_matmul_precision, train  # noqa: E402
from gpu_search import import_searches, search_records  # noqa: E402

DTYPES = ("bf16", "fp32")


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    preset: str
    batch: int
    length: int  # source and target tokens per sentence
    vocab: int
    overrides: tuple = ()  # architecture values replacing the preset's

    def architecture(self):
        from keras_transformer.models.presets import get_preset

        # The Transformer's defaults for what presets leave out (the paper's choices).
        defaults = dict(activation="relu", norm_first=False, layer_norm_epsilon=1e-6)
        arch = {**defaults, **get_preset(self.preset)["model"], **dict(self.overrides)}
        d_model, heads = arch["d_model"], arch["num_heads"]
        arch["key_dim"] = arch["key_dim"] or d_model // heads
        arch["value_dim"] = arch["value_dim"] or d_model // heads
        return arch


SHAPES = {
    "base": Shape("base", "base", batch=384, length=64, vocab=PAPER_VOCAB_SIZE),
    "big": Shape("big", "big", batch=192, length=64, vocab=PAPER_VOCAB_SIZE),
    "multi30k": Shape("multi30k", "multi30k", batch=256, length=16, vocab=MULTI30K_VOCAB_SIZE),
    "tiny": Shape("tiny", "base", batch=8, length=12, vocab=500,
                  overrides=(("num_layers", 2), ("d_model", 64), ("num_heads", 4),
                             ("d_ff", 128))),
}


def matmul_tflops(n, dtype, rounds=3, chain=10):
    """Best TFLOP/s of `chain` back-to-back (n, n) x (n, n) products under jax.jit."""
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal((n, n), dtype=np.float32), dtype) for _ in range(2))
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(chain):
            product = matmul(a, b)
        product.block_until_ready()
        best = max(best, 2 * n**3 * chain / (time.perf_counter() - start) / 1e12)
    return best


def device_name():
    """JAX's first device: the GPU's kind, or the CPU and its core count."""
    import jax

    device = jax.devices()[0]
    return device.device_kind if device.platform != "cpu" else f"cpu ({os.cpu_count()} cores)"


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", type=csv_choice(list(SHAPES)),
                        default=["base", "big", "multi30k"],
                        help="comma-separated, among base, big, multi30k, tiny "
                             "(default base,big,multi30k)")
    parser.add_argument("--dtypes", type=csv_choice(DTYPES), default=list(DTYPES),
                        help="comma-separated, among bf16, fp32 (default both)")
    parser.add_argument("--engines", type=csv_choice(list(ENGINES)), default=list(ENGINES),
                        help="comma-separated, among ours, torch, keras-hub, timed in that "
                             "order (default all: ours, torch, keras-hub)")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed training steps first (at least 1: the first compiles)")
    parser.add_argument("--tiny", action="store_true",
                        help="the tiny shape only (2 layers, d_model 64, batch 8 x 12, vocab "
                             "500) and a small matmul peak: a CPU smoke test")
    parser.add_argument("--search", action=argparse.BooleanOptionalAction, default=True,
                        help="also time our greedy and beam search")
    parser.add_argument("--search-batches", type=csv_ints,
                        default=[32, 1], help="sentences per search call (default 32,1)")
    parser.add_argument("--search-repeats", type=int, default=3,
                        help="timed calls per search (median; after one that compiles)")
    parser.add_argument("--fp32-matmul", choices=list(FP32_MATMUL), default="default",
                        help="float32 matmul precision: each framework's default (recorded in "
                             "the JSON), full float32 (highest) or TensorFloat-32 (tf32) for all")
    parser.add_argument("--attention", choices=["auto", "plain", "fused"], default="auto",
                        help="our attention: auto (the fused kernel where it serves: JAX on a "
                             "GPU, bf16), plain (einsum and softmax) or fused "
                             "(keras.ops.dot_product_attention wherever no weights are read)")
    parser.add_argument("--peak-size", type=int, default=None,
                        help="n of the n^3 matmul peak (default 8192 on a GPU, 512 on a CPU)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.shapes = ["tiny"]
    if args.warmup < 1 or args.steps < 1:
        parser.error(f"--warmup {args.warmup} and --steps {args.steps} must be at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    report = Report()

    import jax
    import keras

    jax_precision = FP32_MATMUL[args.fp32_matmul][0]
    if jax_precision:
        jax.config.update("jax_default_matmul_precision", jax_precision)
    if keras.backend.backend() != "jax":
        sys.exit(f"benchmarks/gpu.py runs Keras on JAX; KERAS_BACKEND is "
                 f"{keras.backend.backend()!r}")
    from keras_transformer.layers.attention import set_attention_implementation

    set_attention_implementation(args.attention)
    args.device = device_name()
    on_gpu = jax.default_backend() != "cpu"
    versions = {"jax": jax.__version__, "keras": keras.__version__}
    missing = {}
    for engine, module in (("torch", "torch"), ("keras-hub", "keras_hub")):
        if engine in args.engines:
            try:
                versions[module] = __import__(module).__version__
            except Exception as error:
                missing[engine] = f"{engine}: {type(error).__name__}: {error}"
    report.emit({"benchmark": "gpu_environment", "device": args.device,
                 "jax_backend": jax.default_backend(), "python": sys.version.split()[0],
                 "versions": versions, "argv": sys.argv[1:]})

    n = args.peak_size or (8192 if on_gpu else 512)
    peak = {"bf16": matmul_tflops(n, "bfloat16"), "fp32": matmul_tflops(n, "float32")}
    report.emit({"benchmark": "gpu_matmul_peak", "device": args.device, "n": n,
                 "bf16_tflops": sig(peak["bf16"]), "fp32_tflops": sig(peak["fp32"]),
                 "fp32_matmul_precision": jax_matmul_precision()})

    # In the order --engines gives (ours first by default: the figure a run cut short must not
    # lose). JAX keeps the memory it took (without preallocation its pool grows as needed, up to
    # 75% of the GPU); PyTorch, run after it, takes what remains.
    for engine in args.engines:
        if engine in missing:
            report.emit({"benchmark": "gpu_train_step", "engine": ENGINES[engine],
                         "skipped": missing[engine]})
            continue
        for name in args.shapes:
            shape = SHAPES[name]
            arch = shape.architecture()
            flop = train_step_flops(arch, shape.vocab, shape.batch, shape.length,
                                    shape.length)
            for dtype in args.dtypes:
                record = {"benchmark": "gpu_train_step", "engine": ENGINES[engine],
                          "shape": name, "dtype": dtype, "batch": shape.batch,
                          "src_len": shape.length, "tgt_len": shape.length,
                          "vocab": shape.vocab, "steps": args.steps, "warmup": args.warmup,
                          "device": args.device, "model_tflop_per_step": sig(flop / 1e12),
                          "attention": args.attention if engine == "ours" else None,
                          "peak_bf16_tflops": sig(peak["bf16"])}

                def measure(engine=engine, shape=shape, dtype=dtype, flop=flop):
                    result = train(engine, shape, dtype, args)
                    step_s = result["ms_per_step"] / 1e3
                    achieved = flop / step_s / 1e12
                    return {**result, "ms_per_step": sig(result["ms_per_step"]),
                            "target_tokens_per_s": round(shape.batch * shape.length / step_s, 1),
                            "achieved_tflops": sig(achieved),
                            "mfu": sig(achieved / peak["bf16"], 3)}

                report.attempt(record, measure)

    if args.search:
        factories, reason = import_searches()
        if factories is None:
            report.emit({"benchmark": "gpu_search", "engine": ENGINES["ours"], "skipped": reason})
        else:
            for name in args.shapes:
                for dtype in args.dtypes:
                    search_records(SHAPES[name], dtype, factories, args, report)
    report.emit({"benchmark": "gpu_summary", "failed": report.failed,
                 "tensorflow_imported": sys.modules.get("tensorflow") is not None})
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
