"""The GPU check in one command: speed against PyTorch and KerasHub, the quick recipe,
the full recipe and a small sweep on val, trained under JAX from the GPU kit's prepared data.

    sh gpu-kit/gpu-check                      # on the GPU machine, from the repository root
    sh gpu-kit/gpu-check --parts c --limits c=560
    python benchmarks/gpu_check.py --kit gpu-kit --out OUT --tiny   # a CPU run, shapes cut down

`make gpu-kit` builds the kit (benchmarks/gpu_kit.py); its `gpu-check` puts the kit's wheels in
a temporary site and runs this script. Three parts, each in its own process (JAX keeps the GPU
memory it took until its process ends) under its own time limit (--limits, seconds), so one
part that fails or overruns leaves the others' figures:

    a  benchmarks/gpu.py: the training step of the paper's base and big models in bf16 with
       MFU against the bf16 matmul peak of the same process, in two processes: ours then
       torch.compile's nn.Transformer (at most A_FIRST seconds of the part), then KerasHub's
       layers with the rest (--attention sets ours everywhere, e.g. plain if the fused
       kernel fails; `benchmarks/gpu.py --attention plain` times the plain path alone)
    b  the quick recipe (`keras-transformer demo`'s: tasks/main_job.py QUICK) trained under JAX
       from the kit's prepared data; weights and length penalty chosen on val as the demo does;
       test2016 sacreBLEU and literature BLEU; the first step's seconds (its compilation) and
       the steps per second
    c  the full recipe (FULL, one model) and a sweep around it (SWEEP: steps, dropout, width,
       label smoothing), each scored on val alone (greedy, the best of final weights and
       checkpoint averages); the best setting's length penalty chosen on val, and its test2016
       decoded once. Each setting trains while the part's time allows (`time_limit_minutes`:
       a setting cut short says so, with the steps it reached); settings start while there
       is time for another (the last one's minutes predict the next's); those left out are
       listed. The whole sweep needs a command of its own: --parts c --limits c=560.

The default limits (a 250, b 170, c 140 seconds) hold the three parts and the wheels' install
in one 600-second command. The first check on an H100 (2026-11-26, docs/backends.md) took
about 25 s per gpu.py process to start and measure the peak, 25-40 s per engine and shape,
and, before static shapes, about 10 s per compiled training step of the recipes.

Output under --out ($OUT on the device machine): gpu-check.jsonl, every result as one JSON line
with its "part" (rewritten whole after each line, so a run cut short keeps what it had), and
a.log, b.log, c.log, each part's own output. `import tensorflow` fails in every part (as on the
GPU machine); --tiny cuts models, shapes and steps down so the whole runs on a CPU in minutes
(tests/test_gpu_kit.py).
"""

import argparse
import datetime
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

from gpu_check_parts import HERE, ROOT, block_tensorflow, part_a, part_b, part_c

PARTS = {"a": "speed: base and big, ours beside torch.compile and KerasHub",
         "b": "the quick recipe", "c": "the full recipe and a sweep on val"}
# Seconds per part: together, with the wheels' install, inside one 10-minute command.
# --tiny checks the path, not the speed: a loaded 2-core CPU gets all the time it needs.
LIMITS = {"a": 250, "b": 170, "c": 140}
TINY_LIMIT = 1200
RESULT_KEYS = ("benchmark", "check")  # a line of a part's output that is a result


def is_result(line):
    if not line.startswith("{"):
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and any(k in record for k in RESULT_KEYS) else None




# -- the parent: runs the parts, collects their results ----------------------------------------


class Results:
    """gpu-check.jsonl under --out, rewritten whole (atomically) after each new line."""

    def __init__(self, out):
        from pipelines.files import write_lines

        self.path = pathlib.Path(out) / "gpu-check.jsonl"
        self._write = write_lines
        self.lines = []

    def add(self, record):
        self.lines.append(json.dumps(record, default=str))
        self._write(self.path, self.lines)
        print(self.lines[-1], flush=True)


def nvidia_smi():
    """The GPU's name, memory and driver as nvidia-smi says, or None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    result = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                             "--format=csv,noheader"], capture_output=True, text=True)
    return result.stdout.strip() or None


def run_part(part, args, results):
    """Runs one part in a child process under its time limit; its results go to `results`, its
    other output to OUT/PART.log."""
    command = [sys.executable, str(HERE / "gpu_check.py"), "--run-part", part, "--kit",
               str(args.kit), "--out", str(args.out), "--work", str(args.work), "--limits",
               ",".join(f"{name}={seconds}" for name, seconds in args.limits.items())]
    if args.tiny:
        command.append("--tiny")
    command += ["--attention", args.attention]
    limit = args.limits[part]
    started = time.monotonic()
    log_path = pathlib.Path(args.out) / f"{part}.log"
    count, timed_out = 0, threading.Event()
    # The log is a stream (what the part prints as it runs), so that a part cut short leaves its
    # output; the results go through the atomic writer.
    with open(log_path, "w", encoding="utf-8") as log:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, cwd=ROOT, start_new_session=True,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})

        def stop():  # the part and whatever it started (its own process group)
            timed_out.set()
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:  # it ended meanwhile
                pass

        watchdog = threading.Timer(limit, stop)
        watchdog.start()
        try:
            for line in child.stdout:
                record = is_result(line.strip())
                if record is not None:
                    count += 1
                    results.add({"part": part, **record})
                else:
                    log.write(line)
                    log.flush()
            child.wait()
        finally:
            watchdog.cancel()
    timed_out = timed_out.is_set()
    results.add({"part": part, "check": "part_done", "what": PARTS[part],
                 "exit": child.returncode, "timed_out": timed_out, "limit_s": limit,
                 "minutes": round((time.monotonic() - started) / 60, 2), "results": count})
    return child.returncode == 0 and not timed_out


def parent(args):
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = Results(out)
    kit_info = json.loads((args.kit / "kit.json").read_text(encoding="utf-8"))
    results.add({"part": "-", "check": "gpu_check_environment", "gpu": nvidia_smi(),
                 "python": sys.version.split()[0], "tiny": args.tiny, "parts": args.parts,
                 "limits": {part: args.limits[part] for part in args.parts},
                 "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                     timespec="seconds"),
                 "kit": {key: kit_info.get(key) for key in ("built", "wheels", "bytes",
                                                            "statistics")}})
    started = time.monotonic()
    passed = {part: run_part(part, args, results) for part in args.parts}
    results.add({"part": "-", "check": "gpu_check_summary", "passed": passed,
                 "minutes": round((time.monotonic() - started) / 60, 2)})
    return 0 if all(passed.values()) else 1


# -- the parts (each in its own process) -------------------------------------------------------

def child(args):
    os.environ.setdefault("KERAS_BACKEND", "jax")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    block_tensorflow()
    sys.path[:0] = [str(ROOT)]
    args.work.mkdir(parents=True, exist_ok=True)
    if args.run_part != "a":  # part a hands --attention to gpu.py; it imports no Keras itself
        from keras_transformer.layers.attention import set_attention_implementation

        set_attention_implementation(args.attention)
    return {"a": part_a, "b": part_b, "c": part_c}[args.run_part](args)


def parse_limits(text):
    limits = {}
    for item in filter(None, text.split(",")):
        part, _, seconds = item.partition("=")
        if part not in PARTS or not seconds.isdigit():
            raise argparse.ArgumentTypeError(
                f"--limits {text!r}: give PART=SECONDS, comma-separated, PART among "
                f"{', '.join(PARTS)} (e.g. a=250,c=140)")
        limits[part] = int(seconds)
    return limits


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kit", type=pathlib.Path, required=True,
                        help="the kit folder (`make gpu-kit`)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("gpu-out"),
                        help="where the JSON lines and logs go ($OUT on the device machine)")
    parser.add_argument("--work", type=pathlib.Path, default=None,
                        help="the runs' folder (default: a new temporary folder)")
    parser.add_argument("--parts", default="a,b,c",
                        help="comma-separated, among a, b, c (default all, in that order)")
    parser.add_argument("--limits", type=parse_limits, default={},
                        help="seconds per part, e.g. a=250,b=170,c=140 (the defaults; "
                             f"{TINY_LIMIT} each with --tiny)")
    parser.add_argument("--attention", choices=["auto", "plain", "fused"], default="auto",
                        help="our attention in every part (auto: the fused kernel where it "
                             "serves; plain: einsum and softmax, e.g. if the fused one fails)")
    parser.add_argument("--tiny", action="store_true",
                        help="tiny models, shapes and steps: the whole check on a CPU")
    parser.add_argument("--run-part", choices=list(PARTS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.limits = {**{part: TINY_LIMIT if args.tiny else LIMITS[part] for part in PARTS},
                   **args.limits}
    args.parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = [part for part in args.parts if part not in PARTS]
    if unknown or not args.parts:
        parser.error(f"--parts {','.join(args.parts)}: choose among {', '.join(PARTS)}")
    if not (args.kit / "kit.json").is_file():
        parser.error(f"--kit {args.kit}: no kit.json there; build the kit with `make gpu-kit`")
    args.kit = args.kit.resolve()
    args.out = args.out.resolve()
    if args.work is None:
        import tempfile

        args.work = pathlib.Path(tempfile.mkdtemp(prefix="gpu-check-runs-"))
    args.work = args.work.resolve()
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.run_part:
        return child(args)
    sys.path[:0] = [str(ROOT)]
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())
