"""The whole `translate` command, timed as a user runs it: a subprocess from start to exit
(Python, TensorFlow and the model loading, tokenizing, searching, writing), on a test set,
against CTranslate2 as its own users run it at its best setting.

    python benchmarks/translate_command.py --run-dir runs/multi30k-en-de-quick
    python benchmarks/translate_command.py --run-dir RUN --precision float32
    python benchmarks/translate_command.py --run-dir RUN --ctranslate2-model FOLDER
    python benchmarks/translate_command.py --run-dir RUN --engines ctranslate2 --repeat 100

In one run, one after the other, each a fresh `keras-transformer translate --run-dir RUN
--input SOURCE --output FILE` (the run's saved decoding choice, e.g. beam 4 alpha 1.0):

    xla_cold     --xla, with an empty persistent compilation cache (KERAS_TRANSFORMER_XLA_CACHE
                 pointed at a new folder): every batch shape compiled
    xla_warm     --xla again, on the cache the first one filled: nothing compiled
    default      no flag (xla auto: the line on standard error says what it chose, kept as
                 `default_xla`), on that warm cache
    lane         --engine ctranslate2 --ctranslate2-model FOLDER (default: the run's
                 CTranslate2 int8 export, made first by `keras-transformer export --format
                 ctranslate2 --quantize int8` into a temporary folder; its time is not counted)
                 with its default workers and threads, then each setting of the threading
                 grid (`lane_settings`; `lane_best`)
    lane_redirected  the lane as `make demo` prints it: `translate ... < SOURCE > FILE`,
                 standard input and output redirected from and to files (default setting)

and the anchor, CTranslate2 itself: benchmarks/ct2_reference.py (a process of ctranslate2 and
sentencepiece only, `translate_iterable`, the same beam, alpha and length limits) on the same
export, once per threading setting (`inter_threads` x `intra_threads`, products up to the core
count) and at CTranslate2's defaults (one worker, intra_threads 0): `ctranslate2_settings`,
`ctranslate2_best` (the setting that won) and `ctranslate2_best_seconds`.

Prints one JSON line: each command's seconds and peak RSS, `*_ratio_vs_ctranslate2`
(CTranslate2's best seconds over the command's: > 1, ours is faster; `ours_best` is the fastest
of our TensorFlow commands, named in `ours_best_setting`), `lane_vs_ctranslate2_defaults`
(CTranslate2 at its defaults over our lane: what a user who does not tune gets),
`xla_warm_speedup` and `xla_cold_speedup` (default seconds over XLA's: > 1, XLA is faster),
sacreBLEU of each output against the references (when the source is not repeated), the share
of lines identical to the default's and the lane's to the reference script's, the CPU
(`keras_transformer.hardware.describe_cpu`) and the load average before and after (the
machines are shared: read the times against it). `--engines ctranslate2` leaves out the
TensorFlow commands; `--repeat N` translates the source N times over (a long file).
"""

import argparse
import gzip
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import add_record_flag, append_result, emit  # noqa: E402
from ct2_reference import label, run_measured, sweep, threading_grid  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def read_lines(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def command(*arguments):
    """The installed command's entry point, run by this Python (it owns its console)."""
    return [sys.executable, "-m", "keras_transformer_command", *arguments]


def run_timed(arguments, environ, source=None, output=None):
    """(seconds, standard error, peak RSS in MiB) of one command, start to exit; raises if it
    fails. `source`, `output`: files its standard input and output are redirected from and
    to (`command < source > output`)."""
    if source is None:
        seconds, _, stderr, rss = run_measured(command(*arguments), environ)
        return seconds, stderr, rss
    with open(source, "rb") as stdin, open(output, "wb") as stdout:
        seconds, _, stderr, rss = run_measured(command(*arguments), environ, stdin, stdout)
    return seconds, stderr, rss


def said_xla(stderr):
    """What the decoder's line says of XLA ("on [auto: ...]"), or None."""
    found = re.search(r"xla (on|off) \[([^\]]*)\]", stderr)
    return f"{found.group(1)} [{found.group(2)}]" if found else None


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--source", default=str(MULTI30K / "test_2016_flickr.en.gz"),
                        help="source lines (.gz read as gzip; default: Multi30k test2016 en)")
    parser.add_argument("--references", default=str(MULTI30K / "test_2016_flickr.de.gz"))
    parser.add_argument("--lang", default="de", help="the references' language (sacreBLEU)")
    parser.add_argument("--ctranslate2-model", help="CTranslate2 export folder (default: the "
                        "run's int8 export, made into a temporary folder)")
    parser.add_argument("--precision", help="--precision for the tensorflow commands "
                        "(default: theirs, auto)")
    parser.add_argument("--batch-size", type=int, help="--batch-size for every command")
    parser.add_argument("--engines", default="tensorflow,ctranslate2",
                        help="tensorflow (our Keras commands), ctranslate2 (our lane and the "
                        "reference script); both by default")
    parser.add_argument("--repeat", type=int, default=1,
                        help="translate the source this many times over (a long file)")
    parser.add_argument("--settings", help="CTranslate2 threading settings to run, e.g. "
                        "2x1,1x1 (WORKERSxTHREADS; default: the whole grid of this machine's "
                        "cores, and CTranslate2's defaults): a long file's run may keep the "
                        "winners of a sweep on a short one")
    add_record_flag(parser, "translate_command")
    args = parser.parse_args(argv)
    engines = {e.strip() for e in args.engines.split(",") if e.strip()}
    grid = threading_grid()
    if args.settings:
        grid = [tuple(int(n) for n in setting.split("x"))
                for setting in args.settings.split(",")]

    import sacrebleu

    from keras_transformer.hardware import describe_cpu

    references = read_lines(args.references) * args.repeat
    extra = (["--precision", args.precision] if args.precision else []) + (
        ["--batch-size", str(args.batch_size)] if args.batch_size else [])
    batch = ["--batch-size", str(args.batch_size)] if args.batch_size else []
    record = {"benchmark": "translate_command", "run_dir": args.run_dir,
              "source": pathlib.Path(args.source).name, "repeat": args.repeat,
              "lines": len(references), **describe_cpu(),
              "load_before": round(os.getloadavg()[0], 2), "precision_flag": args.precision}
    with tempfile.TemporaryDirectory() as folder:
        folder = pathlib.Path(folder)
        source = folder / "source.txt"
        source.write_text("\n".join(read_lines(args.source) * args.repeat) + "\n",
                          encoding="utf-8")
        environ = {name: value for name, value in os.environ.items()
                   if name not in ("TF_XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR")}
        environ["KERAS_TRANSFORMER_XLA_CACHE"] = str(folder / "xla-cache")
        runs = {}
        if "tensorflow" in engines:
            runs.update({"xla_cold": ["--xla", *extra], "xla_warm": ["--xla", *extra],
                         "default": extra})
        if "ctranslate2" in engines:
            ct2 = args.ctranslate2_model
            if ct2 is None:
                run_timed(["export", "--run-dir", args.run_dir, "--format", "ctranslate2",
                           "--quantize", "int8", "--output-dir", str(folder / "ct2")], environ)
                ct2 = str(next((folder / "ct2").glob("*/ctranslate2-int8")))
            lane = ["--engine", "ctranslate2", "--ctranslate2-model", ct2, *batch]
            runs["lane"] = lane
            runs["lane_redirected"] = lane
            for setting in [s for s in grid if s[1]]:  # the reference's grid, defaults aside
                runs[f"lane_{label(setting)}"] = [*lane, "--workers", str(setting[0]),
                                                  "--threads", str(setting[1])]
        outputs = {}
        for name, flags in runs.items():
            output = folder / f"{name}.txt"
            if name == "lane_redirected":
                seconds, stderr, rss = run_timed(["translate", "--run-dir", args.run_dir,
                                                  *flags], environ, source, output)
            else:
                seconds, stderr, rss = run_timed(["translate", "--run-dir", args.run_dir,
                                                  "--input", str(source), "--output",
                                                  str(output), *flags], environ)
            outputs[name] = read_lines(output)
            record[f"{name}_seconds"] = round(seconds, 2)
            record[f"{name}_peak_rss_mb"] = rss
            print(f"{name}: {seconds:.2f} s, {rss} MiB", file=sys.stderr, flush=True)
            if name == "default":
                record["default_xla"] = said_xla(stderr)
        if "ctranslate2" in engines:
            decoding = json.loads((pathlib.Path(args.run_dir) / "decoding.json").read_text()) \
                if (pathlib.Path(args.run_dir) / "decoding.json").is_file() else {}
            anchor = sweep(ct2, source, grid=grid, beam=decoding.get("beam_size", 4),
                           alpha=decoding.get("alpha", 0.6),
                           output_for=lambda name: folder / f"reference {name}.txt",
                           extra=["--batch-size", str(args.batch_size)] if args.batch_size
                           else ())
            reference = read_lines(folder / f"reference {anchor['best']}.txt")
        cache_files = sum(1 for path in (folder / "xla-cache").rglob("*") if path.is_file())
    record["xla_cache_files"] = cache_files
    ours = [name for name in ("default", "xla_warm") if name in outputs]
    if ours:
        best = min(ours, key=lambda name: record[f"{name}_seconds"])
        record.update(ours_best_setting=best, ours_best_seconds=record[f"{best}_seconds"])
    if "ctranslate2" in engines:
        lanes = [name for name in outputs if name.startswith("lane_")
                 and name != "lane_redirected"]
        record["lane_settings"] = {name[5:]: record[f"{name}_seconds"] for name in lanes}
        if lanes:
            record["lane_best"] = min(lanes, key=lambda name: record[f"{name}_seconds"])[5:]
        record["ctranslate2_settings"] = {
            name: {"seconds": r["wall_seconds"], "peak_rss_mb": r["child_peak_rss_mb"]}
            for name, r in anchor["settings"].items()}
        record.update(ctranslate2_best=anchor["best"],
                      ctranslate2_best_seconds=anchor["best_seconds"],
                      ctranslate2_best_peak_rss_mb=anchor["best_peak_rss_mb"],
                      ctranslate2_defaults_seconds=anchor["default_seconds"])
        if anchor["default_seconds"]:
            record["lane_vs_ctranslate2_defaults"] = round(
                anchor["default_seconds"] / record["lane_seconds"], 3)
        record["lane_redirected_same_lines_as_lane"] = round(
            sum(a == b for a, b in zip(outputs["lane_redirected"], outputs["lane"]))
            / len(outputs["lane"]), 4)
        record["lane_same_lines_as_reference"] = round(
            sum(a == b for a, b in zip(outputs["lane"], reference)) / len(reference), 4)
    for name, lines in outputs.items():
        if args.repeat == 1:
            record[f"{name}_bleu"] = round(sacrebleu.corpus_bleu(
                lines, [references], tokenize="13a").score, 2)
        if "default" in outputs:
            record[f"{name}_same_lines_as_default"] = round(
                sum(a == b for a, b in zip(lines, outputs["default"])) / len(lines), 4)
        if "ctranslate2" in engines and name in ("lane", "lane_redirected", "xla_warm",
                                                 "xla_cold", "default"):
            record[f"{name}_ratio_vs_ctranslate2"] = round(
                anchor["best_seconds"] / record[f"{name}_seconds"], 3)
    if ours and "ctranslate2" in engines:
        record["ours_best_ratio_vs_ctranslate2"] = round(
            anchor["best_seconds"] / record["ours_best_seconds"], 3)
    if "tensorflow" in engines:
        for name in ("xla_warm", "xla_cold"):
            record[f"{name}_speedup"] = round(record["default_seconds"]
                                              / record[f"{name}_seconds"], 3)
    record["load_after"] = round(os.getloadavg()[0], 2)
    line = emit(record)
    if args.record:
        append_result("translate_command", line)
    return record


if __name__ == "__main__":
    main()
