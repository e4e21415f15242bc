"""Helpers shared by every benchmark script: timing, the JSON line, argument parsing.

Imports no TensorFlow, no Keras and no JAX, so that benchmarks/gpu.py (JAX, no TensorFlow) uses
it as the TensorFlow scripts do; what needs TensorFlow is in tf_common.py, FLOP counts in
flops.py.
"""

import argparse
import json
import statistics
import time

# The vocabulary of the Multi30k recipe (keras_transformer's default vocab_size, the main job's
# 8000 pieces). A literal here: this module must stay importable without the package.
MULTI30K_VOCAB_SIZE = 8000
# The paper's shared English-German BPE vocabulary (Section 5.1).
PAPER_VOCAB_SIZE = 37000


def sig(x, digits=4):
    """`x` rounded to `digits` significant digits (TFLOP counts of tiny models stay readable)."""
    return float(f"{x:.{digits}g}")


def timed(function, repeats):
    """Median seconds of `repeats` calls of `function()`, after one untimed call (it compiles
    or warms the caches). Returns (median seconds, what the last call returned)."""
    result = function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def peak_rss_mb():
    """Peak resident memory of this process so far, in MiB (Linux reports KiB)."""
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def emit(record):
    """Prints one JSON line (the benchmark's result, with the process's peak RSS) and returns it."""
    line = json.dumps({**record, "peak_rss_mb": peak_rss_mb()}, sort_keys=True)
    print(line, flush=True)
    return line


class Report:
    """Emits one JSON line per measurement of a script that makes several, and remembers
    whether any failed (the script's exit status)."""

    def __init__(self):
        self.failed = False

    emit = staticmethod(emit)

    def attempt(self, record, measure):
        """Emits `record` updated with `measure()`, or with the error it raised."""
        try:
            record = {**record, **measure()}
        except Exception as error:  # one failed measurement (out of memory...) ends no run
            self.failed = True
            record = {**record, "error": f"{type(error).__name__}: {error}"[:800]}
        self.emit(record)


def csv_choice(choices):
    """An argparse `type`: a comma-separated list of values among `choices`."""

    def parse(text):
        values = [v.strip() for v in text.split(",") if v.strip()]
        unknown = [v for v in values if v not in choices]
        if unknown or not values:
            raise argparse.ArgumentTypeError(
                f"{text!r}: choose among {', '.join(choices)} (comma-separated)")
        return values

    return parse


def csv_ints(text):
    """An argparse `type`: comma-separated integers ("32,1")."""
    return [int(v) for v in text.split(",")]
