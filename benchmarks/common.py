"""Helpers shared by the benchmark scripts: quiet start-up, matmul peak, JSON output."""

import json
import math
import os
import re
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import tensorflow as tf  # noqa: E402


def measure_matmul_peak(sizes=(2048, 4096), repeats=5, dtype=tf.float32):
    """Best GFLOP/s of large square matmuls (2 n^3 FLOPs each) on this machine, now."""
    best = 0.0
    for n in sizes:
        a = tf.random.normal((n, n), dtype=dtype)
        b = tf.random.normal((n, n), dtype=dtype)
        matmul = tf.function(tf.linalg.matmul)
        matmul(a, b).numpy()  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            matmul(a, b).numpy()
            best = max(best, 2 * n**3 / (time.perf_counter() - start) / 1e9)
    return best


def matmul_params(layer):
    """Number of weights in the Dense kernels of `layer` (each used once per token)."""
    return sum(int(math.prod(w.shape)) for w in layer.weights if w.path.endswith("kernel"))


def search_flops(model, batch, beam, src_len, out_len):
    """Matmul FLOPs a search must do: the encoder and the cross-attention keys and values once
    per source token, then for every one of batch x beam rows at each of out_len steps the
    decoder's projections, its attention over the steps so far and the source, and the output
    projection. Softmax, LayerNorm, top-k and cache reordering are not counted."""
    arch = model.architecture
    layers, d_model = arch["num_layers"], arch["d_model"]
    heads, dk, dv = arch["num_heads"], arch["key_dim"], arch["value_dim"]
    vocab = model.target_vocab_size or model.vocab_size
    cross_kv = layers * d_model * heads * (dk + dv)  # weights applied to the encoder output
    source_tokens, rows = batch * src_len, batch * beam
    flops = 2 * (matmul_params(model.encoder) + cross_kv) * source_tokens
    per_row = matmul_params(model.decoder) - cross_kv + vocab * d_model
    attention = layers * heads * (dk + dv) * (out_len * (out_len + 1) // 2 + out_len * src_len)
    return flops + 2 * rows * (per_row * out_len + attention)


def peak_rss_mb():
    """Peak resident memory of this process so far, in MiB (Linux reports KiB)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def emit(record):
    """Prints one JSON line (the benchmark's result, with the process's peak RSS) and returns it."""
    line = json.dumps({**record, "peak_rss_mb": peak_rss_mb()}, sort_keys=True)
    print(line, flush=True)
    return line


_OP_EVENT = re.compile(r"^[^\s:]+:(_?[A-Z][A-Za-z0-9_]*)$")  # "scope/name:OpType"


def op_time_table(logdir, top=25):
    """Total time per TensorFlow op type from the newest profiler trace under `logdir`.

    Reads the `.xplane.pb` written by `tf.profiler.experimental.start/stop` and sums the
    durations of the host's op events (the executor's TF ops, XLA clusters, tf.function
    calls) by op type. Ops overlap when the executor runs them in parallel, so the sum can
    exceed the wall-clock time. Returns [(op type, milliseconds, events)] sorted by time.
    """
    import collections
    import glob

    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True),
                   key=os.path.getmtime)
    if not paths:
        raise FileNotFoundError(f"no .xplane.pb profile under {logdir}")
    space = xplane_pb2.XSpace()
    with open(paths[-1], "rb") as f:
        space.ParseFromString(f.read())
    totals = collections.defaultdict(lambda: [0.0, 0])
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                match = _OP_EVENT.match(name)
                if not match:
                    continue  # runtime bookkeeping (executor, eager, tf.data), not an op
                kind = match.group(1)
                totals[kind][0] += event.duration_ps / 1e9
                totals[kind][1] += 1
    table = sorted(((k, round(v[0], 1), v[1]) for k, v in totals.items()),
                   key=lambda row: -row[1])
    return table[:top]
