"""The training engines benchmarks/gpu.py times (its docstring describes each): ours and
KerasHub's under `model.fit` on Keras' JAX backend, `torch.nn.Transformer` under torch.compile.

Each trains on the same shapes and random batches and returns {"ms_per_step", "params",
"fp32_matmul_precision", ...}. Imports no TensorFlow; Keras, JAX, KerasHub and PyTorch are
imported where they are used, so a missing one costs only its engine.
"""

import gc
import math
import time

import numpy as np

# Flag value -> the engine's name in the JSON lines.
ENGINES = {"ours": "keras-jax", "torch": "torch-compile", "keras-hub": "keras-hub-jax"}
# Betas and epsilon of the paper (Section 5.3); the schedule does not change the step's cost.
ADAM = dict(learning_rate=1e-4, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
# --fp32-matmul: (JAX's jax_default_matmul_precision, torch.set_float32_matmul_precision).
FP32_MATMUL = {"default": (None, None), "highest": ("highest", "highest"),
               "tf32": ("tensorfloat32", "high")}
FIRST_ID = 4  # ids 0-3 are PAD, BOS, EOS, UNK (pipelines/special_ids.py)


def jax_matmul_precision():
    import jax

    return jax.config.jax_default_matmul_precision or "default"


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
    """Milliseconds per optimizer step of `model.fit` on fixed-shape random batches.

    The clock starts in the training loop's own thread, before it dispatches the first timed
    step and after the last warm-up step has finished, so no timed step can have run before it.
    It stops at the first sign that the last step has finished: its end-of-batch callback, or
    `fit` returning. Both come at or after that step's end, so a busy host can only lengthen
    the figure, never shrink it.
    """
    import threading

    import keras

    class StepClock(keras.callbacks.Callback):
        # Keras calls an async-safe callback from a thread pool once the step's logs are ready
        # (reading the loss waits for the device), without holding the training loop back.
        # A pool thread may run long after its step ended (on 2 busy cores, all at the end), so
        # its time only bounds the step's end from above.
        async_safe = True

        def __init__(self):
            super().__init__()
            self.warm = threading.Event()
            self.start = self.end = None

        def on_train_batch_end(self, batch, logs=None):
            float(logs["loss"])  # already a Python float where Keras converted it
            if batch == warmup - 1:
                self.warm.set()
            elif batch == warmup + steps - 1:
                self.end = time.perf_counter()

        def on_train_batch_begin(self, batch, logs=None):
            # Always called in the loop's thread, before the step is dispatched.
            if batch == warmup:
                self.warm.wait()
                self.start = time.perf_counter()

    source, target_in, target_out = random_batches(shape, warmup + steps)
    clock = StepClock()
    model.fit((source, target_in), target_out, batch_size=shape.batch, epochs=1, shuffle=False,
              verbose=0, callbacks=[clock])
    returned = time.perf_counter()  # fit has read the last step's logs (the epoch's end)
    end = returned if clock.end is None else min(clock.end, returned)
    return (end - clock.start) / steps * 1e3


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


def train(engine, shape, dtype, args):
    """Times `engine` (a key of ENGINES) on `shape` in `dtype` for args.steps steps."""
    if engine == "torch":
        return torch_train(shape, dtype, args)
    return keras_train(our_model if engine == "ours" else keras_hub_model, shape, dtype, args)
