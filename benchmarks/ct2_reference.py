"""CTranslate2 as its own users run it: the anchor of every CTranslate2 comparison.

A file translated the way CTranslate2's documentation shows, in a process that imports only
ctranslate2 and sentencepiece (no TensorFlow, no Keras, not our package): the export's
SentencePiece model (spm.model), `Translator.translate_iterable` (or `translate_batch` over the
whole file with --api batch) with `max_batch_size` sentences per batch, the same beam, length
penalty and length limits as our engine (the export's keras_transformer.json: the longest
input; outputs up to the longest input + --extra-length tokens), and pieces decoded back.

    python benchmarks/ct2_reference.py --model FOLDER --input test.en --output out.de
    python benchmarks/ct2_reference.py --model FOLDER --input test.en --workers 2 --threads 1
    python benchmarks/ct2_reference.py --model FOLDER --input test.en --sweep

One translation prints one JSON line: the setting, the seconds from the process's start to its
last line written (`seconds`, start-up and model loading included, as a user's whole command)
and of the translation alone (`translate_seconds`), the peak RSS. `--sweep` runs this script
once per setting of CTranslate2's documented threading knobs (`inter_threads` workers x
`intra_threads` threads, every product up to the core count, plus CTranslate2's own defaults:
one worker, `intra_threads=0`), each in a fresh process timed from outside (its wall time and
peak RSS), and prints every setting's figures, the best (`best`) and the defaults' (`default`).
`sweep()` is the same for the other benchmarks (translate_command.py, serving_load.py).
"""

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import time

START = time.perf_counter()  # the process's start, as near as Python lets us see it
METADATA = "keras_transformer.json"
DEFAULTS = (1, 0)  # CTranslate2's own: one worker, intra_threads 0 (its choice: min(4, cores))


def cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def threading_grid(count=None):
    """(workers, threads) settings to sweep on `count` cores: powers of two whose product is
    at most the core count, then CTranslate2's defaults."""
    count = count or cores()
    powers = [1 << i for i in range(count.bit_length()) if 1 << i <= count]
    grid = [(w, t) for w in powers for t in powers if w * t <= count]
    return grid + [DEFAULTS]


def label(setting):
    workers, threads = setting
    return f"{workers}x{threads}" if threads else f"{workers}x0 (CTranslate2's defaults)"


def peak_rss_mb():
    """This process's peak resident memory (VmHWM: its own address space's, not a parent's
    carried over at the fork)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def read_lines(path):
    if str(path).endswith(".gz"):
        import gzip

        with gzip.open(path, "rt", encoding="utf-8") as handle:
            return [line.rstrip("\n") for line in handle]
    with open(path, encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle]


class Reference:
    """A CTranslate2 export loaded as CTranslate2's users load it: the Translator at a
    threading setting, the export's SentencePiece model, and our search's limits (the
    export's keras_transformer.json: the longest input and the suppressed pieces)."""

    def __init__(self, model, workers, threads, beam=4, alpha=1.0, extra_length=50, **options):
        import ctranslate2
        import sentencepiece

        folder = pathlib.Path(model)
        limits = json.loads((folder / METADATA).read_text(encoding="utf-8"))
        self.processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / "spm.model"))
        self.translator = ctranslate2.Translator(str(folder), device="cpu",
                                                 inter_threads=workers, intra_threads=threads)
        self.longest, self.extra_length = limits["max_input_length"] - 1, extra_length
        self.options = dict(beam_size=beam, length_penalty=alpha, max_input_length=0,
                            suppress_sequences=[[p] for p in limits.get("suppressed", [])]
                            or None, **options)

    def translate(self, lines, api="batch"):
        """Translations of `lines` (an empty line stays empty, untranslated): one
        translate_batch call, or translate_iterable (`api="iterable"`)."""
        pieces = [p[: self.longest] for p in self.processor.encode(
            [" ".join(line.split()) for line in lines], out_type=str)]
        todo = [p for p in pieces if p]
        limit = max(map(len, todo), default=0) + self.extra_length
        search = (self.translator.translate_iterable if api == "iterable"
                  else self.translator.translate_batch)
        results = search(iter(todo) if api == "iterable" else todo,
                         max_decoding_length=limit, **self.options)
        found = iter([self.processor.decode(r.hypotheses[0]) for r in results])
        return [next(found) if p else "" for p in pieces]


def translate(args):
    import ctranslate2

    reference = Reference(args.model, args.workers, args.threads, args.beam, args.alpha,
                          args.extra_length, max_batch_size=args.batch_size,
                          batch_type=args.batch_type)
    lines = read_lines(args.input)
    began = time.perf_counter()
    output = reference.translate(lines, args.api)
    translate_seconds = time.perf_counter() - began
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write("\n".join(output) + "\n")
    return {"setting": label((args.workers, args.threads)), "workers": args.workers,
            "threads": args.threads, "lines": len(lines), "api": args.api,
            "batch_type": args.batch_type, "max_batch_size": args.batch_size,
            "seconds": round(time.perf_counter() - START, 3),
            "translate_seconds": round(translate_seconds, 3),
            "peak_rss_mb": peak_rss_mb(), "ctranslate2_version": ctranslate2.__version__}


# Runs a command and reports on its last line of standard error its exit status, wall time
# and peak RSS. A process started by this small launcher, not by the benchmark, so that the
# peak RSS is the command's own (Linux carries a parent's peak into a child it forks: a
# benchmark that has loaded TensorFlow would be every child's floor).
LAUNCHER = """import json, os, subprocess, sys, time
began = time.perf_counter()
child = subprocess.Popen(sys.argv[1:])
_, status, usage = os.wait4(child.pid, 0)
print(json.dumps({"status": os.waitstatus_to_exitcode(status),
                  "seconds": time.perf_counter() - began,
                  "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}), file=sys.stderr)
"""


def run_measured(command, env=None, stdin=None, stdout=None):
    """(seconds, standard output, standard error, peak RSS in MiB) of `command`, timed from
    its start to its exit; SystemExit with its standard error if it fails. `stdin`, `stdout`:
    open files the command reads and writes in place of pipes (its standard output is then
    "")."""
    done = subprocess.run([sys.executable, "-S", "-c", LAUNCHER, *command], env=env,
                          stdin=stdin, stdout=stdout or subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    *lines, last = done.stderr.rstrip("\n").split("\n")
    figures = json.loads(last)
    if figures["status"]:
        raise SystemExit(f"{' '.join(command)} failed ({figures['status']}):\n"
                         + "\n".join(lines)[-3000:])
    return figures["seconds"], done.stdout or "", "\n".join(lines), figures["peak_rss_mb"]


def run_once(setting, model, source, output=None, beam=4, alpha=1.0, extra=()):
    """One translation of `source` at `setting` in a fresh process: its record, with the
    wall time and peak RSS seen from outside (`wall_seconds`, `child_peak_rss_mb`)."""
    command = [sys.executable, os.path.abspath(__file__), "--model", str(model), "--input",
               str(source), "--workers", str(setting[0]), "--threads", str(setting[1]),
               "--beam", str(beam), "--alpha", str(alpha), *extra]
    if output:
        command += ["--output", str(output)]
    wall, out, _, rss = run_measured(
        command, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    record = json.loads(out.strip().splitlines()[-1])
    record.update(wall_seconds=round(wall, 3), child_peak_rss_mb=rss)
    return record


def sweep(model, source, beam=4, alpha=1.0, grid=None, output_for=None, extra=()):
    """Every setting of `grid` (default `threading_grid()`) run once by `run_once`:
    {"settings": {label: record}, "best": label of the least wall time, "best_seconds",
    "default": CTranslate2's defaults' label, "default_seconds"}. `output_for(label)` names
    a setting's output file (None: not written)."""
    records = {}
    for setting in grid or threading_grid():
        name = label(setting)
        records[name] = run_once(setting, model, source,
                                 output_for(name) if output_for else None, beam, alpha, extra)
        print(f"ctranslate2 reference {name}: {records[name]['wall_seconds']} s",
              file=sys.stderr, flush=True)
    best = min((n for n in records if "defaults" not in n),
               key=lambda n: records[n]["wall_seconds"])
    default = label(DEFAULTS)
    return {"settings": records, "best": best, "best_seconds": records[best]["wall_seconds"],
            "best_peak_rss_mb": records[best]["child_peak_rss_mb"],
            "default": default, "default_seconds": records.get(default, {}).get("wall_seconds")}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a CTranslate2 export folder of "
                        "keras-transformer (its spm.model and keras_transformer.json)")
    parser.add_argument("--input", required=True, help="source lines (.gz read as gzip)")
    parser.add_argument("--output", help="translations (default: not written)")
    parser.add_argument("--workers", type=int, default=DEFAULTS[0],
                        help="inter_threads (default 1, CTranslate2's)")
    parser.add_argument("--threads", type=int, default=DEFAULTS[1],
                        help="intra_threads (default 0, CTranslate2's: its own choice)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=1.0, help="length_penalty (1.0)")
    parser.add_argument("--extra-length", type=int, default=50,
                        help="outputs up to the longest input + this many tokens (50)")
    parser.add_argument("--batch-size", type=int, default=64, help="max_batch_size (64)")
    parser.add_argument("--batch-type", default="examples", choices=("examples", "tokens"))
    parser.add_argument("--api", default="iterable", choices=("iterable", "batch"),
                        help="translate_iterable (default) or translate_batch")
    parser.add_argument("--sweep", action="store_true",
                        help="every threading setting, each in a fresh process")
    args = parser.parse_args(argv)
    if args.sweep:
        extra = ["--api", args.api, "--batch-type", args.batch_type, "--batch-size",
                 str(args.batch_size), "--extra-length", str(args.extra_length)]
        record = sweep(args.model, args.input, args.beam, args.alpha, extra=extra)
        record = {"benchmark": "ct2_reference", "cores": cores(), **record}
    else:
        record = {"benchmark": "ct2_reference", **translate(args)}
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
