"""Helpers shared by the benchmark scripts: quiet start-up, matmul peak, JSON output."""

import json
import os
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


def emit(record):
    """Prints one JSON line (the benchmark's result) and returns it."""
    line = json.dumps(record, sort_keys=True)
    print(line, flush=True)
    return line
