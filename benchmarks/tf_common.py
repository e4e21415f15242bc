"""Helpers of the benchmark scripts that run on TensorFlow: matmul peak, profiler op table.

Importing this module sets TensorFlow's environment (native logs quiet, Keras on TensorFlow)
unless the caller has, then imports TensorFlow: a TensorFlow script imports it before Keras,
TensorFlow or keras_transformer. benchmarks/gpu.py (JAX, no TensorFlow) never imports it.
"""

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
