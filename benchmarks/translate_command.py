"""The whole `translate` command, timed as a user runs it: a subprocess from start to exit
(Python, TensorFlow and the model loading, tokenizing, searching, writing), on a test set.

    python benchmarks/translate_command.py --run-dir /work/demo/runs/multi30k-en-de-quick
    python benchmarks/translate_command.py --run-dir RUN --precision float32
    python benchmarks/translate_command.py --run-dir RUN --ctranslate2-model FOLDER

In one run, one after the other, each a fresh `keras-transformer translate --run-dir RUN
--input SOURCE --output FILE` (the run's saved decoding choice, e.g. beam 4 alpha 1.0):

    xla_cold     --xla, with an empty persistent compilation cache (KERAS_TRANSFORMER_XLA_CACHE
                 pointed at a new folder): every batch shape compiled
    xla_warm     --xla again, on the cache the first one filled: nothing compiled
    default      no flag (xla auto: the line on standard error says what it chose, kept as
                 `default_xla`), on that warm cache
    ctranslate2  --engine ctranslate2 --ctranslate2-model FOLDER (default: the run's
                 CTranslate2 int8 export, made first by `keras-transformer export --format
                 ctranslate2 --quantize int8` into a temporary folder; its time is not counted)

Prints one JSON line: each command's seconds, `*_ratio_vs_ctranslate2` (CTranslate2's
seconds over the command's: > 1, ours is faster), `xla_warm_speedup` and `xla_cold_speedup`
(default seconds over XLA's: > 1, XLA is faster), sacreBLEU of each output against the
references and the share of lines identical to the default's (the outputs agree), the CPU
(`keras_transformer.hardware.describe_cpu`) and the load average before and after (the
machines are shared: read the times against it).
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
from common import emit  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"


def read_lines(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def command(*arguments):
    """The installed command's entry point, run by this Python (it owns its console)."""
    return [sys.executable, "-m", "keras_transformer_command", *arguments]


def run_timed(arguments, environ):
    """(seconds, standard error) of one command, start to exit; raises if it fails."""
    start = time.perf_counter()
    done = subprocess.run(command(*arguments), env=environ, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(arguments)} failed ({done.returncode}):\n{done.stderr}")
    return seconds, done.stderr


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
    args = parser.parse_args(argv)

    import sacrebleu

    from keras_transformer.hardware import describe_cpu

    references = read_lines(args.references)
    extra = (["--precision", args.precision] if args.precision else []) + (
        ["--batch-size", str(args.batch_size)] if args.batch_size else [])
    record = {"benchmark": "translate_command", "run_dir": args.run_dir,
              "source": pathlib.Path(args.source).name, "lines": len(references),
              **describe_cpu(), "load_before": round(os.getloadavg()[0], 2),
              "precision_flag": args.precision}
    with tempfile.TemporaryDirectory() as folder:
        folder = pathlib.Path(folder)
        source = folder / "source.txt"
        source.write_text("\n".join(read_lines(args.source)) + "\n", encoding="utf-8")
        environ = {name: value for name, value in os.environ.items()
                   if name not in ("TF_XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR")}
        environ["KERAS_TRANSFORMER_XLA_CACHE"] = str(folder / "xla-cache")
        ct2 = args.ctranslate2_model
        if ct2 is None:
            run_timed(["export", "--run-dir", args.run_dir, "--format", "ctranslate2",
                       "--quantize", "int8", "--output-dir", str(folder / "ct2")], environ)
            ct2 = str(next((folder / "ct2").glob("*/ctranslate2-int8")))
        runs = {"xla_cold": ["--xla"], "xla_warm": ["--xla"], "default": [],
                "ctranslate2": ["--engine", "ctranslate2", "--ctranslate2-model", ct2]}
        outputs = {}
        for name, flags in runs.items():
            output = folder / f"{name}.txt"
            ours = extra if name != "ctranslate2" else extra[2:] if args.precision else extra
            seconds, stderr = run_timed(["translate", "--run-dir", args.run_dir, "--input",
                                         str(source), "--output", str(output), *flags,
                                         *ours], environ)
            outputs[name] = read_lines(output)
            record[f"{name}_seconds"] = round(seconds, 2)
            if name == "default":
                record["default_xla"] = said_xla(stderr)
        cache_files = sum(1 for path in (folder / "xla-cache").rglob("*") if path.is_file())
    record["xla_cache_files"] = cache_files
    for name, lines in outputs.items():
        record[f"{name}_bleu"] = round(sacrebleu.corpus_bleu(
            lines, [references], tokenize="13a").score, 2)
        record[f"{name}_same_lines_as_default"] = round(
            sum(a == b for a, b in zip(lines, outputs["default"])) / len(lines), 4)
        if name != "ctranslate2":
            record[f"{name}_ratio_vs_ctranslate2"] = round(
                record["ctranslate2_seconds"] / record[f"{name}_seconds"], 3)
    for name in ("xla_warm", "xla_cold"):
        record[f"{name}_speedup"] = round(record["default_seconds"]
                                          / record[f"{name}_seconds"], 3)
    record["load_after"] = round(os.getloadavg()[0], 2)
    emit(record)
    return record


if __name__ == "__main__":
    main()
