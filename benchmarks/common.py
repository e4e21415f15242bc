"""Helpers shared by every benchmark script: timing, the JSON line, argument parsing.

Imports no TensorFlow, no Keras and no JAX, so that benchmarks/gpu.py (JAX, no TensorFlow) uses
it as the TensorFlow scripts do; what needs TensorFlow is in tf_common.py, FLOP counts in
flops.py.
"""

import argparse
import datetime
import importlib.util
import json
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
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


# -- the record the docs quote -----------------------------------------------------------------
# A benchmark given --record appends its result line, with when, at which commit and on which
# CPU class it was taken, to benchmarks/results/NAME.jsonl; the docs quote the newest line.
RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"


def add_record_flag(parser, name):
    """Adds `--record` to a benchmark's parser: its result goes to results/NAME.jsonl too."""
    parser.add_argument("--record", action="store_true",
                        help=f"also append the result line, with the date, commit and CPU "
                        f"class, to benchmarks/results/{name}.jsonl (the figures the docs quote)")


def _hardware():
    """keras_transformer/hardware.py loaded by path: it imports only os, and this module stays
    importable without the package (and without Keras)."""
    path = pathlib.Path(__file__).resolve().parents[1] / "keras_transformer" / "hardware.py"
    spec = importlib.util.spec_from_file_location("_benchmark_hardware", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _commit():
    """The checkout's commit (short), "+dirty" when tracked files differ; "unknown" outside git."""
    root = pathlib.Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, text=True,
                                capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "keras_transformer",
                                "pipelines", "benchmarks"], cwd=root).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def append_result(name, line, results_dir=None):
    """Appends the JSON `line` (as `emit` returns it) to RESULTS_DIR/NAME.jsonl with the UTC
    date, the commit, the command that made it, the CPU and its class and the cores this
    process may use; returns the entry written. The file is rewritten whole through the
    project's atomic writer."""
    from pipelines.files import write_text

    hardware = _hardware()
    command = " ".join(["python", f"benchmarks/{pathlib.Path(sys.argv[0]).name}",
                        *map(shlex.quote, sys.argv[1:])])
    entry = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
             "commit": _commit(), "command": command, "cpu": hardware.cpu_model(),
             "cpu_class": hardware.cpu_class(), "cores": len(os.sched_getaffinity(0)),
             "benchmark": name, **json.loads(line)}
    path = pathlib.Path(results_dir or RESULTS_DIR) / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    before = path.read_text(encoding="utf-8") if path.exists() else ""
    write_text(path, before + json.dumps(entry, sort_keys=True) + "\n")
    return entry


def latest(name, results_dir=None, **match):
    """The newest entry of RESULTS_DIR/NAME.jsonl whose keys equal `match` (None: none)."""
    path = pathlib.Path(results_dir or RESULTS_DIR) / f"{name}.jsonl"
    entries = [json.loads(text) for text in path.read_text(encoding="utf-8").splitlines()
               if text.strip()] if path.exists() else []
    entries = [e for e in entries if all(e.get(k) == v for k, v in match.items())]
    return entries[-1] if entries else None
