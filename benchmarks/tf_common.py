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


_OP_EVENT = re.compile(r"^([^\s:]+):(_?[A-Z][A-Za-z0-9_]*)$")  # "scope/name:OpType"


def _op_events(logdir):
    """(op name, op type, milliseconds) of every host op event in the newest profiler trace
    under `logdir` (the executor's TF ops, XLA clusters, tf.function calls; runtime
    bookkeeping such as the executor, eager or tf.data events left out)."""
    import glob

    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True),
                   key=os.path.getmtime)
    if not paths:
        raise FileNotFoundError(f"no .xplane.pb profile under {logdir}")
    space = xplane_pb2.XSpace()
    with open(paths[-1], "rb") as f:
        space.ParseFromString(f.read())
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        for line in plane.lines:
            for event in line.events:
                match = _OP_EVENT.match(plane.event_metadata[event.metadata_id].name)
                if match:
                    yield match.group(1), match.group(2), event.duration_ps / 1e9


def op_time_table(logdir, top=25):
    """Total time per TensorFlow op type from the newest profiler trace under `logdir`.

    Reads the `.xplane.pb` written by `tf.profiler.experimental.start/stop` and sums the
    durations of the host's op events (the executor's TF ops, XLA clusters, tf.function
    calls) by op type. Ops overlap when the executor runs them in parallel, so the sum can
    exceed the wall-clock time. Returns [(op type, milliseconds, events)] sorted by time.
    """
    import collections

    totals = collections.defaultdict(lambda: [0.0, 0])
    for _, kind, milliseconds in _op_events(logdir):
        totals[kind][0] += milliseconds
        totals[kind][1] += 1
    table = sorted(((k, round(v[0], 1), v[1]) for k, v in totals.items()),
                   key=lambda row: -row[1])
    return table[:top]


# The groups of a beam search step's ops, first match wins (op names carry the Keras layers'
# and `beam_search.beam_search`'s name scopes: decode_step, scores, select_beams,
# reorder_caches).
STEP_GROUPS = (
    ("top-k", r":TopKV2$"),
    ("self-attention + cache", r"/self_attention"),
    ("cross-attention", r"/cross_attention"),
    ("feed-forward", r"/feed_forward"),
    ("embedding + positions", r"/decode_step/.*(token_embedding|positional_encoding)"),
    ("output projection", r"/decode_step/"),
    ("log-softmax + masks", r"/scores/"),
    ("beam reordering of caches", r"/reorder_caches/"),
    ("loop bookkeeping", r"^while/"),
)


def step_group_table(logdir, steps, groups=STEP_GROUPS):
    """Ops and milliseconds per search step by group (`STEP_GROUPS`) from the newest profiler
    trace under `logdir` of a search of `steps` steps; the ops outside the loop (the encoder,
    the set-up) are one more row, per search. Returns [(group, ops per step, ms per step)]
    then ("outside the loop (per search)", ops, ms) and ("total per step", ops, ms)."""
    totals = {name: [0.0, 0] for name, _ in groups}
    outside = [0.0, 0]
    rules = [(name, re.compile(pattern)) for name, pattern in groups]
    for name, op_type, milliseconds in _op_events(logdir):
        full = f"{name}:{op_type}"
        group = next((g for g, rule in rules if rule.search(full)), None)
        entry = totals[group] if group else outside
        entry[0] += milliseconds
        entry[1] += 1
    rows = [(g, round(n / steps, 1), round(ms / steps, 3)) for g, (ms, n) in totals.items()]
    rows.append(("outside the loop (per search)", outside[1], round(outside[0], 1)))
    rows.append(("total per step", round(sum(r[1] for r in rows[:-1]), 1),
                 round(sum(r[2] for r in rows[:-1]), 3)))
    return rows
