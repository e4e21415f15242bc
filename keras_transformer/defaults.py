"""Defaults that several commands share, in one table.

The command line, the `Translator`, the exports and the main job read these instead of writing
the numbers again. Each value is the paper's unless its comment says otherwise.
"""

import os
import pathlib
import re

# Longest sentence, in subword tokens with EOS: training drops longer pairs, decoding truncates
# longer inputs (ours; the paper does not say). The vocabulary size and the pairs per prepared
# shard are the input pipelines' defaults too (pipelines/defaults.py holds them).
from pipelines.defaults import MAX_LENGTH, SHARD_PAIRS, VOCAB_SIZE  # noqa: E402,F401

# The train command's token budget per batch, per side and per replica: sized for a CPU (the
# paper's ~25000 is the tf.data pipeline's default, pipelines.defaults.TOKENS_PER_BATCH).
TRAIN_TOKENS_PER_BATCH = 4096

# Where exports go, relative to the working directory: EXPORT_DIR/<run name>/<version>/ for a
# SavedModel (TensorFlow Serving's layout), .../tflite/ and .../ctranslate2[-QUANTIZE]/ beside it.
EXPORT_DIR = "saved_models"


def export_name(run_dir, name=None):
    """The name an export of `run_dir` goes under: `name`, else the run directory's name
    ('+' allowed: a run of several targets is named multi30k-en-de+fr+cs-quick)."""
    from keras_transformer.errors import InputError

    name = name or os.path.basename(os.path.abspath(run_dir))
    if not re.fullmatch(r"[A-Za-z0-9_.+-]+", name):
        raise InputError(f"name={name!r}: use letters, digits, '.', '_', '+' and '-' only.")
    return name


def export_base(run_dir, output_dir=EXPORT_DIR, name=None):
    """OUTPUT_DIR/NAME: the folder of a run's exports (SavedModel versions, tflite/,
    ctranslate2*/)."""
    return pathlib.Path(output_dir) / export_name(run_dir, name)


def ctranslate2_folder(run_dir, quantize="none", output_dir=EXPORT_DIR, name=None):
    """OUTPUT_DIR/NAME/ctranslate2[-QUANTIZE]: where a run's CTranslate2 export goes (and where
    the CTranslate2 engine looks for it)."""
    dirname = "ctranslate2" if quantize == "none" else f"ctranslate2-{quantize}"
    return export_base(run_dir, output_dir, name) / dirname


# A SavedModel's in-graph batching of concurrent requests (export/batching.py; `export
# --batch-max-rows/--batch-timeout-ms/--batch-threads`): the most sentences searched at once,
# how long a request waits for others, and how many batches are searched at once. Chosen by
# benchmarks/serving_load.py (docs/export.md, "Batching").
BATCH_MAX_ROWS = 32
BATCH_TIMEOUT_MS = 5.0
BATCH_THREADS = 2

# The searches' defaults (translation's and parsing's) are the decoding options' declaration:
# keras_transformer/decoding/request.py.
