"""Builds the GPU kit: everything a GPU machine without TensorFlow, Keras or a network needs to
run `gpu-check` (benchmarks/gpu_check.py), in one git-ignored folder.

    make gpu-kit                                   # = python benchmarks/gpu_kit.py --output gpu-kit
    python benchmarks/gpu_kit.py --no-wheels --source-dir DIR --vocab-size 200 --output KIT

The folder (docs/backends.md, "The GPU kit"):
    gpu-check            the one command to run there, from the repository root
    wheels/              keras, namex, optree (CPython 3.12, manylinux x86_64), keras-hub and
                         sacremoses: what the GPU machines' image lacks (`pip download`)
    data/prepared/       the Multi30k training pairs prepared here with TensorFlow: ids in .npz
                         shards and the sentencepiece model (pipelines.prepared), which JAX
                         training reads with numpy and sentencepiece alone
    data/multi30k/       the val and test2016 text (raw .gz) and their official tokenized
                         references (tok/), for the choices on val and the scores
    kit.json             what was built from what, and the folder's size

Why prepared here: reading and tokenizing the corpus goes through tf.data, which the GPU
machine does not have; the prepared folder is the form `train --prepared-data` takes anyway.
The kit must travel with the device tool (64 MiB with the repository): the builder prints its
size and refuses a kit above `--max-mib`.
"""

import argparse
import datetime
import json
import os
import pathlib
import shutil
import subprocess
import sys

_HERE = pathlib.Path(__file__).resolve().parent
ROOT = _HERE.parent
sys.path[:0] = [str(ROOT)]

# What the GPU machines' image lacks (KINDS.md lists what it holds), pinned to this project's
# versions; `pip download` of these needs no dependencies (their own are on the image).
WHEELS = ("keras==3.15.1", "namex==0.1.0", "optree==0.20.0", "keras-hub==0.32.0",
          "sacremoses==0.2.0")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
# The prepared folder's files that travel (its plan cache and lock are rebuilt there).
PREPARED_FILES = ("manifest.json", "statistics.json", "vocabulary.json", "spm.model")
SPLIT_STEMS = ("val", "test_2016_flickr")


def download_wheels(folder):
    """The wheels of WHEELS for CPython 3.12 on manylinux x86_64, into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
               "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
               *[flag for platform in PLATFORMS for flag in ("--platform", platform)],
               "--dest", str(folder), *WHEELS]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"gpu-kit: pip download failed (exit {result.returncode}); it needs the package "
                 f"registry (or --no-wheels for a kit without them):\n{result.stderr[-2000:]}")
    return sorted(path.name for path in folder.glob("*.whl"))


def prepare(args, source_dir):
    """The prepared training data of the raw Multi30k files in `source_dir`, as the demo's
    recipe prepares it (its vocabulary seed and shards: the same cache entry), with the kit's
    vocabulary size and maximum length. TensorFlow reads the files through the Multi30k tfds
    builder, kept in `args.data_dir`; the data cache answers when it holds them."""
    from keras_transformer.runs import make_config
    from keras_transformer.tasks.main_job import QUICK
    from pipelines import datasets

    config = make_config(None, origin="recipe", **{
        **QUICK, "src_lang": args.src_lang, "tgt_lang": args.tgt_lang,
        "vocab_size": args.vocab_size, "max_length": args.max_length,
        "source_dir": str(source_dir), "data_dir": args.data_dir,
        "data_cache": args.data_cache})
    return datasets.prepare_training_data(config.dataset, **config.prepared_data_arguments(),
                                          progress=False)


def copy_prepared(data, folder):
    folder.mkdir(parents=True)
    names = list(PREPARED_FILES)
    for shard in data.directory.glob("shard-*"):
        names.append(shard.name)
    for name in names:
        if (data.directory / name).is_file():
            shutil.copy2(data.directory / name, folder / name)


def copy_texts(source_dir, folder, src_lang, tgt_lang):
    """val and test2016 (raw) and their official tokenized target references."""
    (folder / "tok").mkdir(parents=True)
    for stem in SPLIT_STEMS:
        for lang in (src_lang, tgt_lang):
            path = source_dir / f"{stem}.{lang}.gz"
            if not path.is_file():
                sys.exit(f"gpu-kit: {path} is missing: --source-dir must hold the raw Multi30k "
                         f"files ({', '.join(SPLIT_STEMS)} in {src_lang} and {tgt_lang}, .gz).")
            shutil.copy2(path, folder / path.name)
        reference = source_dir / "tok" / f"{stem}.lc.norm.tok.{tgt_lang}"
        if reference.is_file():  # literature BLEU is reported where it is there
            shutil.copy2(reference, folder / "tok" / reference.name)


def folder_bytes(folder):
    return sum(path.stat().st_size for path in pathlib.Path(folder).rglob("*") if path.is_file())


def gpu_check_script():
    """The kit's `gpu-check`: puts the wheels in a temporary site, then runs
    benchmarks/gpu_check.py with the kit."""
    return """#!/bin/sh
# gpu-check: the GPU check of keras-transformer, run from the repository root on the
# GPU machine: `sh gpu-kit/gpu-check` (options: python3 benchmarks/gpu_check.py --help).
# Installs the kit's wheels into a temporary site (nothing is installed system-wide), then runs
# benchmarks/gpu_check.py, which writes its JSON lines and logs under $OUT (default: ./gpu-out).
set -e
KIT=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python3}
if [ ! -f benchmarks/gpu_check.py ]; then
    echo "gpu-check: run it from the keras-transformer repository root" >&2; exit 2
fi
if ls "$KIT"/wheels/*.whl >/dev/null 2>&1; then
    SITE=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-site.XXXXXX")
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \\
        --target "$SITE" "$KIT"/wheels/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
exec "$PYTHON" benchmarks/gpu_check.py --kit "$KIT" --out "${OUT:-gpu-out}" "$@"
"""


def build(args):
    from pipelines.files import atomic_path

    source_dir = pathlib.Path(args.source_dir).resolve()
    data = prepare(args, source_dir)
    output = pathlib.Path(args.output)
    with atomic_path(output) as folder:
        folder.mkdir()
        wheels = download_wheels(folder / "wheels") if args.wheels else []
        copy_prepared(data, folder / "data" / "prepared")
        copy_texts(source_dir, folder / "data" / "multi30k", args.src_lang, args.tgt_lang)
        script = folder / "gpu-check"
        script.write_text(gpu_check_script(), encoding="utf-8")
        script.chmod(0o755)
        sizes = {"wheels": folder_bytes(folder / "wheels") if wheels else 0,
                 "data": folder_bytes(folder / "data")}
        sizes["total"] = folder_bytes(folder)
        info = {"built": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds"),
                "src_lang": args.src_lang, "tgt_lang": args.tgt_lang,
                "source_dir": str(source_dir), "prepared_from": str(data.directory),
                "statistics": {key: data.statistics[key] for key in
                               ("vocab_size", "max_length", "pairs", "vocabulary_sha256")
                               if key in data.statistics},
                "wheels": wheels, "bytes": sizes}
        (folder / "kit.json").write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
        if sizes["total"] > args.max_mib * 2**20:
            raise SystemExit(f"gpu-kit: the kit is {sizes['total'] / 2**20:.1f} MiB, above "
                             f"--max-mib {args.max_mib} (the device tool carries 64 MiB with "
                             "the repository); nothing was written.")
    mib = {key: round(value / 2**20, 2) for key, value in sizes.items()}
    print(f"gpu-kit: wrote {output}/ ({mib['total']} MiB: wheels {mib['wheels']}, data "
          f"{mib['data']}; {data.statistics.get('pairs', '?')} training pairs, vocabulary "
          f"{data.statistics.get('vocab_size', '?')})")
    print(f"on the GPU machine, from the repository root: OUT=... sh {output}/gpu-check")
    return info


def parse_args(argv):
    from keras_transformer.defaults import MAX_LENGTH, VOCAB_SIZE

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", default="gpu-kit", help="the kit folder (default gpu-kit, "
                        "git-ignored; replaced whole)")
    parser.add_argument("--source-dir", default=None,
                        help="the raw Multi30k files (default $MULTI30K_DIR or "
                             "../shared/data/multi30k)")
    parser.add_argument("--src-lang", default="en")
    parser.add_argument("--tgt-lang", default="de")
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE,
                        help=f"shared vocabulary (default {VOCAB_SIZE}: the recipe's)")
    parser.add_argument("--max-length", type=int, default=MAX_LENGTH)
    parser.add_argument("--data-cache", default=None,
                        help="the prepared-data cache (default as for train)")
    parser.add_argument("--data-dir", default=None,
                        help="tensorflow-datasets' data directory, where the Multi30k builder "
                             "keeps what it read (default tfds'; give another for other files "
                             "than the real corpus)")
    parser.add_argument("--wheels", action=argparse.BooleanOptionalAction, default=True,
                        help="download the wheels the GPU machine lacks (needs the registry)")
    parser.add_argument("--max-mib", type=float, default=48.0,
                        help="refuse a kit above this size (default 48: the repository "
                             "travels beside it within 64 MiB)")
    args = parser.parse_args(argv)
    if args.source_dir is None:
        from pipelines.sources import default_multi30k_dir

        found = default_multi30k_dir()
        if found is None:
            parser.error("no Multi30k folder found: give --source-dir (the raw .gz files)")
        args.source_dir = str(found)
    return args


def main(argv=None):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    build(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
