"""Training-step and search speed of our Transformer under JAX, beside PyTorch and KerasHub.

    python benchmarks/gpu.py                                      # everything (a GPU machine)
    python benchmarks/gpu.py --shapes base --dtypes bf16 --engines ours,torch --no-search
    python benchmarks/gpu.py --tiny --steps 2 --warmup 1          # CPU smoke test (jax CPU)

Made for a GPU machine with JAX (CUDA), and optionally PyTorch and KerasHub, and no TensorFlow:
the script blocks `import tensorflow` (a CPU run here behaves as it will there) and runs Keras on
JAX (KERAS_BACKEND defaults to "jax"). Without internet, bring the wheels of keras, namex,
optree (cp312) and keras-hub in a folder .whl (benchmarks/GPU.md gives the download command),
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
import gc
import inspect
import json
import math
import os
import statistics
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
# JAX otherwise takes 75% of the GPU's memory at its first operation; PyTorch shares the process.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# Make `import tensorflow` fail as on a machine without it (None in sys.modules: the import
# raises ModuleNotFoundError, importlib.util.find_spec answers None), unless something has
# imported it already.
for _name in ("tensorflow", "tensorflow_text"):
    sys.modules.setdefault(_name, None)

import numpy as np  # noqa: E402

ENGINES = {"ours": "keras-jax", "torch": "torch-compile", "keras-hub": "keras-hub-jax"}
DTYPES = ("bf16", "fp32")
# Betas and epsilon of the paper (Section 5.3); the schedule does not change the step's cost.
ADAM = dict(learning_rate=1e-4, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
# --fp32-matmul: (JAX's jax_default_matmul_precision, torch.set_float32_matmul_precision).
FP32_MATMUL = {"default": (None, None), "highest": ("highest", "highest"),
               "tf32": ("tensorfloat32", "high")}
FIRST_ID = 4  # ids 0-3 are PAD, BOS, EOS, UNK (pipelines/special_ids.py)


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
    "base": Shape("base", "base", batch=384, length=64, vocab=37000),
    "big": Shape("big", "big", batch=192, length=64, vocab=37000),
    "multi30k": Shape("multi30k", "multi30k", batch=256, length=16, vocab=8000),
    "tiny": Shape("tiny", "base", batch=8, length=12, vocab=500,
                  overrides=(("num_layers", 2), ("d_model", 64), ("num_heads", 4),
                             ("d_ff", 128))),
}


# -- output ----------------------------------------------------------------------------------


def sig(x, digits=4):
    """`x` rounded to `digits` significant digits (TFLOP counts of tiny models stay readable)."""
    return float(f"{x:.{digits}g}")


def peak_rss_mb():
    """Peak resident memory of this process so far, in MiB (Linux reports KiB)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


class Report:
    """Prints one JSON line per record and remembers whether any measurement failed."""

    def __init__(self):
        self.failed = False

    def emit(self, record):
        print(json.dumps({**record, "peak_rss_mb": peak_rss_mb()}, sort_keys=True), flush=True)

    def attempt(self, record, measure):
        """Emits `record` updated with `measure()`, or with the error it raised."""
        try:
            record = {**record, **measure()}
        except Exception as error:  # one failed measurement (out of memory...) ends no run
            self.failed = True
            record = {**record, "error": f"{type(error).__name__}: {error}"[:800]}
        self.emit(record)


# -- FLOPs and the matmul peak ---------------------------------------------------------------


def model_flop_per_step(arch, vocab, batch, src_len, tgt_len):
    """Matmul FLOPs of one training step (forward and backward): see the module docstring."""
    d_model, heads, layers = arch["d_model"], arch["num_heads"], arch["num_layers"]
    dk, dv, d_ff = arch["key_dim"], arch["value_dim"], arch["d_ff"]
    query_out = heads * (dk + dv) * d_model  # W_Q and W_O
    key_value = heads * (dk + dv) * d_model  # W_K and W_V
    ffn = 2 * d_model * d_ff
    src_tokens, tgt_tokens = batch * src_len, batch * tgt_len
    forward = 2 * layers * (query_out + key_value + ffn) * src_tokens  # encoder
    # Decoder: self-attention, cross-attention queries and output, FFN on target tokens; the
    # cross-attention keys and values on source tokens; then the output projection.
    forward += 2 * layers * (2 * query_out + key_value + ffn) * tgt_tokens
    forward += 2 * layers * key_value * src_tokens
    forward += 2 * vocab * d_model * tgt_tokens
    per_pair = 2 * heads * (dk + dv)  # Q K^T and weights x V, per (query, key) pair
    forward += layers * per_pair * batch * (src_len**2 + tgt_len**2 + tgt_len * src_len)
    return 3 * forward


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


def jax_matmul_precision():
    import jax

    return jax.config.jax_default_matmul_precision or "default"


def device_name():
    import jax

    device = jax.devices()[0]
    return device.device_kind if device.platform != "cpu" else f"cpu ({os.cpu_count()} cores)"


# -- Keras engines (ours, KerasHub) ----------------------------------------------------------


def set_policy(dtype):
    import keras

    keras.mixed_precision.set_global_policy("mixed_bfloat16" if dtype == "bf16" else "float32")


def random_batches(shape, count, seed=0):
    """((source, target input), target output) ids for `count` batches, as numpy arrays."""
    rng = np.random.default_rng(seed)
    rows = (count * shape.batch, shape.length)
    return tuple(rng.integers(FIRST_ID, shape.vocab, rows, dtype=np.int32) for _ in range(3))


def keras_ms_per_step(model, shape, steps, warmup):
    """Milliseconds per optimizer step of `model.fit` on fixed-shape random batches."""
    import keras

    class StepClock(keras.callbacks.Callback):
        # Keras calls an async-safe callback from a thread once the step's logs are ready
        # (reading the loss waits for the device), without holding the training loop back.
        async_safe = True

        def __init__(self):
            super().__init__()
            self.done = {}

        def on_train_batch_end(self, batch, logs=None):
            float(logs["loss"])  # already a Python float where Keras converted it
            self.done[batch] = time.perf_counter()

    source, target_in, target_out = random_batches(shape, warmup + steps)
    clock = StepClock()
    model.fit((source, target_in), target_out, batch_size=shape.batch, epochs=1, shuffle=False,
              verbose=0, callbacks=[clock])
    last = warmup + steps - 1
    return (clock.done[last] - clock.done[warmup - 1]) / steps * 1e3


def compile_keras(model):
    import keras

    model.compile(optimizer=keras.optimizers.Adam(**ADAM),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    return model


def our_model(shape):
    from keras_transformer.models.transformer import Transformer

    model = Transformer(vocab_size=shape.vocab, **shape.architecture())
    model.build()
    return model


def keras_hub_model(shape):
    """The same architecture from KerasHub's layers: one embedding shared by source and target
    and tied to the output projection, sinusoidal positions, post-norm blocks."""
    import keras
    import keras_hub

    arch = shape.architecture()
    d_model, dropout = arch["d_model"], arch["dropout"]
    embedding = keras_hub.layers.ReversibleEmbedding(shape.vocab, d_model, tie_weights=True,
                                                     name="token_embedding")
    positions = keras_hub.layers.SinePositionEncoding(name="positions")

    def embed(ids, name):
        x = embedding(ids) * math.sqrt(d_model)
        return keras.layers.Dropout(dropout, name=f"{name}_dropout")(x + positions(x))

    blocks = dict(intermediate_dim=arch["d_ff"], num_heads=arch["num_heads"], dropout=dropout,
                  activation=arch["activation"], layer_norm_epsilon=arch["layer_norm_epsilon"],
                  normalize_first=arch["norm_first"])
    source = keras.Input((None,), dtype="int32", name="source_ids")
    target = keras.Input((None,), dtype="int32", name="target_ids")
    source_mask = keras.ops.not_equal(source, 0)
    target_mask = keras.ops.not_equal(target, 0)
    x = embed(source, "source")
    for i in range(arch["num_layers"]):
        x = keras_hub.layers.TransformerEncoder(**blocks, name=f"encoder_layer_{i}")(
            x, padding_mask=source_mask)
    y = embed(target, "target")
    for i in range(arch["num_layers"]):
        y = keras_hub.layers.TransformerDecoder(**blocks, name=f"decoder_layer_{i}")(
            y, x, decoder_padding_mask=target_mask, encoder_padding_mask=source_mask)
    logits = keras.ops.cast(embedding(y, reverse=True), "float32")
    return keras.Model((source, target), logits, name="keras_hub_transformer")


def keras_train(build, shape, dtype, args):
    import keras

    set_policy(dtype)
    try:
        keras.utils.set_random_seed(0)
        model = compile_keras(build(shape))
        ms = keras_ms_per_step(model, shape, args.steps, args.warmup)
        params = model.count_params()
    finally:
        set_policy("fp32")
        model = None
        keras.backend.clear_session()
        gc.collect()
    return {"ms_per_step": ms, "params": params,
            "fp32_matmul_precision": jax_matmul_precision()}


# -- PyTorch ---------------------------------------------------------------------------------


def torch_train(shape, dtype, args):
    """nn.Transformer of the same sizes, its forward pass and loss under torch.compile."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    arch = shape.architecture()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    d_model, vocab = arch["d_model"], shape.vocab

    class TorchTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(vocab, d_model)
            position = torch.arange(shape.length)[:, None]
            rates = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
            table = torch.zeros(shape.length, d_model)
            table[:, 0::2] = torch.sin(position * rates)
            table[:, 1::2] = torch.cos(position * rates)
            self.register_buffer("positions", table, persistent=False)
            self.dropout = nn.Dropout(arch["dropout"])
            self.transformer = nn.Transformer(
                d_model, arch["num_heads"], arch["num_layers"], arch["num_layers"], arch["d_ff"],
                arch["dropout"], activation=arch["activation"],
                layer_norm_eps=arch["layer_norm_epsilon"], batch_first=True,
                norm_first=arch["norm_first"])

        def embed(self, ids):
            x = self.embedding(ids) * math.sqrt(d_model) + self.positions[: ids.shape[1]]
            return self.dropout(x)

        def forward(self, source, target):
            length = target.shape[1]
            causal = torch.triu(torch.ones(length, length, dtype=torch.bool,
                                           device=target.device), diagonal=1)  # True: masked
            hidden = self.transformer(
                self.embed(source), self.embed(target), tgt_mask=causal,
                src_key_padding_mask=source == 0, tgt_key_padding_mask=target == 0,
                memory_key_padding_mask=source == 0, tgt_is_causal=True)
            return F.linear(hidden, self.embedding.weight)  # tied output projection

    torch_precision = FP32_MATMUL[args.fp32_matmul][1]
    if torch_precision:
        torch.set_float32_matmul_precision(torch_precision)
    torch._dynamo.reset()  # compile afresh: no guards or dynamic shapes left from a last run
    torch.manual_seed(0)
    model = TorchTransformer().to(device).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=ADAM["learning_rate"],
                                 betas=(ADAM["beta_1"], ADAM["beta_2"]), eps=ADAM["epsilon"],
                                 fused=device == "cuda")

    @torch.compile(dynamic=False)
    def loss_fn(source, target_in, target_out):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            logits = model(source, target_in)
        return F.cross_entropy(logits.float().reshape(-1, vocab), target_out.reshape(-1).long())

    source, target_in, target_out = (torch.from_numpy(a).to(device)
                                     for a in random_batches(shape, 1))

    def step():
        loss = loss_fn(source, target_in, target_out)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    try:
        for _ in range(args.warmup):
            step()
        sync()
        start = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync()
        ms = (time.perf_counter() - start) / args.steps * 1e3
        params = sum(p.numel() for p in model.parameters())
    finally:
        del model, optimizer, loss_fn
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()  # hand the memory back before JAX's engines run
    return {"ms_per_step": ms, "params": params,
            "fp32_matmul_precision": torch.get_float32_matmul_precision(),
            "torch_device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}


# -- search ----------------------------------------------------------------------------------


def import_searches():
    """(greedy, beam) factories, or the reason they cannot run under this backend."""
    try:
        from keras_transformer.decoding.beam_search import compiled_beam_search
        from keras_transformer.decoding.search import compiled_greedy_search
    except Exception as error:
        return None, f"search: {type(error).__name__}: {error}"
    return (compiled_greedy_search, compiled_beam_search), None


def make_search(factory, model, **options):
    accepted = inspect.signature(factory).parameters
    return factory(model, **{k: v for k, v in options.items() if k in accepted})


def search_speed(search, shape, batch, repeats):
    """Milliseconds per call and tokens returned (best hypothesis) on random source ids."""
    rng = np.random.default_rng(1)
    source = rng.integers(FIRST_ID, shape.vocab, (batch, shape.length), dtype=np.int32)

    def run():
        result = search(source)
        ids = result["ids"] if isinstance(result, dict) else result[0]
        ids = np.asarray(ids)  # waits for the device
        return ids[:, 0] if ids.ndim == 3 else ids  # beam: (B, K, T), best first

    run()  # compiles
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        ids = run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, int(np.count_nonzero(ids))


def search_records(shape, dtype, factories, args, report):
    import keras

    set_policy(dtype)
    try:
        keras.utils.set_random_seed(0)
        model = our_model(shape)
        for batch in args.search_batches:
            for name, factory, beam in (("greedy", factories[0], 1), ("beam", factories[1], 4)):
                record = {"benchmark": "gpu_search", "engine": ENGINES["ours"],
                          "shape": shape.name, "dtype": dtype, "search": name, "beam": beam,
                          "batch": batch, "src_len": shape.length, "device": args.device}

                def measure(factory=factory, beam=beam, batch=batch):
                    options = dict(extra_length=0, jit_compile=True)
                    if beam > 1:
                        options["beam_size"] = beam
                    search = make_search(factory, model, **options)
                    ms, tokens = search_speed(search, shape, batch, args.search_repeats)
                    return {"ms_per_call": sig(ms),
                            "sentences_per_s": round(batch / ms * 1e3, 1),
                            "target_tokens": tokens,
                            "target_tokens_per_s": round(tokens / ms * 1e3, 1)}

                report.attempt(record, measure)
    finally:
        set_policy("fp32")
        model = None
        keras.backend.clear_session()
        gc.collect()


# -- main ------------------------------------------------------------------------------------


def csv_choice(choices):
    def parse(text):
        values = [v.strip() for v in text.split(",") if v.strip()]
        unknown = [v for v in values if v not in choices]
        if unknown or not values:
            raise argparse.ArgumentTypeError(
                f"{text!r}: choose among {', '.join(choices)} (comma-separated)")
        return values

    return parse


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
                        help="comma-separated, among ours, torch, keras-hub (default all)")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps")
    parser.add_argument("--warmup", type=int, default=3,
                        help="untimed training steps first (at least 1: the first compiles)")
    parser.add_argument("--tiny", action="store_true",
                        help="the tiny shape only (2 layers, d_model 64, batch 8 x 12, vocab "
                             "500) and a small matmul peak: a CPU smoke test")
    parser.add_argument("--search", action=argparse.BooleanOptionalAction, default=True,
                        help="also time our greedy and beam search")
    parser.add_argument("--search-batches", type=lambda s: [int(v) for v in s.split(",")],
                        default=[32, 1], help="sentences per search call (default 32,1)")
    parser.add_argument("--search-repeats", type=int, default=3,
                        help="timed calls per search (median; after one that compiles)")
    parser.add_argument("--fp32-matmul", choices=list(FP32_MATMUL), default="default",
                        help="float32 matmul precision: each framework's default (recorded in "
                             "the JSON), full float32 (highest) or TensorFloat-32 (tf32) for all")
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

    runners = {"torch": torch_train,
               "ours": lambda s, d, a: keras_train(our_model, s, d, a),
               "keras-hub": lambda s, d, a: keras_train(keras_hub_model, s, d, a)}
    # PyTorch first: it hands its cached memory back when done, while JAX keeps what it takes.
    for engine in [e for e in ("torch", "ours", "keras-hub") if e in args.engines]:
        if engine in missing:
            report.emit({"benchmark": "gpu_train_step", "engine": ENGINES[engine],
                         "skipped": missing[engine]})
            continue
        for name in args.shapes:
            shape = SHAPES[name]
            arch = shape.architecture()
            flop = model_flop_per_step(arch, shape.vocab, shape.batch, shape.length,
                                       shape.length)
            for dtype in args.dtypes:
                record = {"benchmark": "gpu_train_step", "engine": ENGINES[engine],
                          "shape": name, "dtype": dtype, "batch": shape.batch,
                          "src_len": shape.length, "tgt_len": shape.length,
                          "vocab": shape.vocab, "steps": args.steps, "warmup": args.warmup,
                          "device": args.device, "model_tflop_per_step": sig(flop / 1e12),
                          "peak_bf16_tflops": sig(peak["bf16"])}

                def measure(engine=engine, shape=shape, dtype=dtype, flop=flop):
                    result = runners[engine](shape, dtype, args)
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
