"""Peak memory of `keras-transformer translate --input F --output O` on a small and a huge input,
and a translate killed part-way and run again.

    python benchmarks/translate_memory.py                      # 10,000 and 1,000,000 lines
    python benchmarks/translate_memory.py --lines 2000,50000 --run-dir runs/my-tiny-run

Without --run-dir it first trains a run of the tiny preset for 30 steps on a toy corpus it
writes (about 30 s): its translations are poor, its memory is that of any tiny model. Each
input is short lines of 1-4 words; each translate is a fresh process, greedy (`--beam 1`),
float32, with --batch-size sentences per batch, and its peak resident memory is read with
os.wait4 (that process's own ru_maxrss). `rss_ratio` is the largest input's peak over the
smallest's: the streaming design keeps it near 1 (the whole file is never held). Then a
translate of the smallest input is killed (SIGKILL) once its first window (16 batches: 41% of
10,000 lines) is written, run again, and its output compared with the uninterrupted run's
(`resume_identical`).

Prints one JSON line. Seconds and sentences/s are those of a machine shared with other work
when `load_average` says so; memory does not depend on it.
"""

import argparse
import json
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import csv_ints, emit  # noqa: E402

WORDS = ["dog", "cat", "bird", "runs", "jumps", "sleeps", "the", "a", "red", "big", "small",
         "green", "in", "on", "park", "house", "tree", "water"]
COMMAND = [sys.executable, "-m", "keras_transformer.cli"]


def write_lines(path, count, seed, words=(1, 4)):
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as handle:
        for _ in range(count):
            handle.write(" ".join(rng.choice(WORDS) for _ in range(rng.randint(*words))) + "\n")
    return path


def train_tiny_run(folder):
    corpus = {}
    for name, seed in (("train", 0), ("dev", 1)):
        src = write_lines(folder / f"{name}.src", 400 if name == "train" else 40, seed, (2, 9))
        tgt = folder / f"{name}.tgt"
        tgt.write_text("".join(" ".join(reversed(line.upper().split())) + "\n"
                               for line in src.read_text(encoding="utf-8").splitlines()),
                       encoding="utf-8")
        corpus[name] = (src, tgt)
    run_dir = folder / "run"
    subprocess.run([*COMMAND, "train", "--preset", "tiny", "--dataset", "text",
                    "--train-src", str(corpus["train"][0]), "--train-tgt", str(corpus["train"][1]),
                    "--dev-src", str(corpus["dev"][0]), "--dev-tgt", str(corpus["dev"][1]),
                    "--vocab-size", "400", "--tokens-per-batch", "256", "--max-length", "32",
                    "--train-steps", "30", "--precision", "float32", "--verbose", "0",
                    "--output-dir", str(run_dir), "--no-tune"], check=True, capture_output=True)
    return run_dir


def translate(args, run_dir, source, output, kill=False):
    """(peak RSS MiB, seconds, exit status) of one translate process; with kill, SIGKILL once
    the resumable record counts its first window done."""
    record = pathlib.Path(str(output) + ".partial.json")
    command = [*COMMAND, "translate", "--run-dir", str(run_dir), "--input", str(source),
               "--output", str(output), "--beam", "1", "--precision", "float32",
               "--batch-size", str(args.batch_size)]
    log = open(str(output) + ".log", "w+b")  # its standard error (progress lines, a failure)
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
    waiting = kill
    while True:  # os.wait4 (not Popen.poll, which reaps without the usage) until it ends
        pid, status, usage = os.wait4(process.pid, os.WNOHANG if waiting else 0)
        if pid:
            break
        try:
            if json.loads(record.read_text(encoding="utf-8"))["lines"] > 0:
                os.kill(process.pid, signal.SIGKILL)
                waiting = False
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    process.returncode = os.waitstatus_to_exitcode(status)
    log.seek(0)
    error = log.read().decode(errors="replace")
    log.close()
    if not kill and process.returncode != 0:
        raise SystemExit(f"translate failed ({process.returncode}): {error[-2000:]}")
    return round(usage.ru_maxrss / 1024, 1), time.perf_counter() - start, process.returncode


def cpu_name():
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=csv_ints, default=[10_000, 1_000_000],
                        help="input sizes, comma-separated (10000,1000000)")
    parser.add_argument("--batch-size", type=int, default=256, help="sentences per batch (256)")
    parser.add_argument("--run-dir", help="a trained run (default: train a tiny one first)")
    parser.add_argument("--work-dir", help="where inputs and outputs go (default: a temporary "
                        "folder, removed at the end)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as temporary:
        folder = pathlib.Path(args.work_dir or temporary)
        folder.mkdir(parents=True, exist_ok=True)
        run_dir = args.run_dir or train_tiny_run(folder)
        sizes = sorted(args.lines)
        rss, seconds = [], []
        for count in sizes:
            source = write_lines(folder / f"in-{count}.txt", count, seed=count)
            output = folder / f"out-{count}.txt"
            peak, took, _ = translate(args, run_dir, source, output)
            with open(output, "rb") as handle:
                assert sum(1 for _ in handle) == count, f"{output}: not {count} lines"
            rss.append(peak)
            seconds.append(round(took, 1))
            print(f"{count} lines: peak RSS {peak} MiB, {took:.0f} s", file=sys.stderr)
        small = folder / f"in-{sizes[0]}.txt"
        resumed = folder / "resumed.txt"
        _, _, killed = translate(args, run_dir, small, resumed, kill=True)
        was_partial = not resumed.exists() and resumed.with_name("resumed.txt.partial").exists()
        translate(args, run_dir, small, resumed)
        identical = resumed.read_bytes() == (folder / f"out-{sizes[0]}.txt").read_bytes()
    emit({"benchmark": "translate_memory", "lines": sizes, "batch_size": args.batch_size,
          "beam": 1, "translate_peak_rss_mb": rss, "rss_ratio": round(rss[-1] / rss[0], 3),
          "seconds": seconds,
          "sentences_per_s": [round(c / s) for c, s in zip(sizes, seconds)],
          "killed_status": killed, "killed_part_way": was_partial,
          "resume_identical": identical, "cpu": cpu_name(), "cores": os.cpu_count(),
          "load_average": [round(x, 1) for x in (*load_before, *os.getloadavg())]})


if __name__ == "__main__":
    main()
