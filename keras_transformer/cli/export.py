"""`average`, `export` and `saved-model-cli`: a run's weights, and the run for serving."""

import argparse
import sys

from keras_transformer.cli.flags import add_flags, add_run_flags, tensorflow_only
from keras_transformer.decoding.request import DEFAULTS, EXPORT
from keras_transformer.defaults import BATCH_MAX_ROWS, BATCH_THREADS, BATCH_TIMEOUT_MS, EXPORT_DIR


def average(args):
    import os
    import pathlib

    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.runs import open_single_run

    run = open_single_run(args.run_dir, "averaging checkpoints")
    with run.lock("averaging"):
        model, paths = run.average(args.last, every=args.every)
        output = run.save_model(model, averaged=True, path=args.output)
        if pathlib.Path(output).resolve().parent == run.directory.resolve():
            # What the run decodes with from now on (its beam and alpha are kept).
            label = f"average of the last {len(paths)} checkpoints" + (
                f", {args.every} apart" if args.every > 1 else "")
            Decoder.save_choice(run, model=pathlib.Path(output).name, weights=label,
                                chosen_by="keras-transformer average")
    print(f"averaged {len(paths)} checkpoints ({', '.join(os.path.basename(p) for p in paths)})"
          f" into {output}")


def export(args):
    tensorflow_only("export", "run it again with KERAS_BACKEND=tensorflow on a machine with "
                    "TensorFlow (runs trained under JAX export as they are)")
    import logging

    from absl import logging as absl_logging

    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.export import Batching, export_run

    # TensorFlow logs every renamed function input while saving; keep the output readable.
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    decoder = Decoder.from_flags(args, EXPORT)
    print(decoder.describe(), file=sys.stderr)
    with decoder.run.lock("exporting"):  # no training or averaging changes the run meanwhile
        path = export_run(
            decoder, format=args.format, quantize=args.quantize,
            output_dir=args.output_dir, name=args.name, version=args.version,
            overwrite=args.overwrite, ids_only=args.ids_only,
            batching=None if args.no_batching else Batching(
                max_rows=args.batch_max_rows, timeout_ms=args.batch_timeout_ms,
                num_threads=args.batch_threads),
            warmup=not args.no_warmup)
    print(f"exported {args.format} to {path}")


def saved_model_cli(args):
    tensorflow_only("saved-model-cli", "run it with KERAS_BACKEND=tensorflow")
    import tensorflow_text  # noqa: F401  (registers the sentencepiece ops the graph uses)
    from tensorflow.python.tools import saved_model_cli as tool

    sys.argv = ["saved_model_cli", *args.arguments]
    tool.main()


def register(commands):
    parser = commands.add_parser(
        "average",
        help="average the last N checkpoints of a run into one model",
        description="Averages the weights of the last N checkpoints (paper: 5 for base, 20 for "
        "big) and saves the result as a .keras model; saved in the run, it becomes the model "
        "that translate, evaluate and export use (RUN_DIR/decoding.json).",
    )
    add_run_flags(parser)
    parser.add_argument("--last", type=int, default=5, help="checkpoints to average (5)")
    parser.add_argument("--every", type=int, default=1,
                        help="take every N-th checkpoint counting back from the newest, for "
                        "averages spread over more steps (1: the last K in a row)")
    parser.add_argument("--output", help="output file (default RUN_DIR/averaged.keras)")
    parser.set_defaults(run=average)

    parser = commands.add_parser(
        "export",
        help="export a trained run as a SavedModel (TensorFlow Serving), TFLite or CTranslate2 "
        "model",
        description="SavedModel: OUTPUT_DIR/NAME/VERSION/ with the signatures serving_default "
        "(strings in, translations and scores out; beam_size and alpha optional inputs, "
        "defaults the run's decoding choice, else "
        f"{DEFAULTS['beam_size']} and {DEFAULTS['alpha']}; --beam and --alpha also fix the "
        "TFLite search, where beam 1 is greedy, and the beam of the SavedModel's "
        "translate_ids_xla signature) and translate_ids (int32 ids in and "
        "out, core TensorFlow ops only). TFLite: "
        "OUTPUT_DIR/NAME/tflite/translator-<search>-<quantization>.tflite, ids "
        "in and out for one sentence, with spm.model beside it. CTranslate2: "
        "OUTPUT_DIR/NAME/ctranslate2-int8/ (int8 by default; ctranslate2/ with --quantize none) "
        "for CTranslate2's Translator (and "
        "`keras-transformer translate --engine ctranslate2`), spm.model inside; needs the "
        "ctranslate2 package (installed with keras-transformer; else pip install "
        "'keras-transformer[ctranslate2]'). Files are written "
        "under a temporary name and renamed when complete.",
    )
    add_run_flags(parser)
    parser.add_argument("--format", default="savedmodel",
                        choices=("savedmodel", "tflite", "ctranslate2"),
                        help="savedmodel (default), tflite or ctranslate2")
    parser.add_argument("--quantize", default=None,
                        choices=("none", "dynamic", "float16", "int8", "int8_float32"),
                        help="weights: none (float32); TFLite: dynamic (int8 weights) or "
                        "float16; CTranslate2: int8, int8_float32 or float16 (default: int8 "
                        "for ctranslate2, as its CPU users run it; none for the others)")
    parser.add_argument("--output-dir", default=EXPORT_DIR,
                        help=f"base directory (default {EXPORT_DIR})")
    parser.add_argument("--name", help="model name (default: the run directory's name)")
    parser.add_argument("--version", type=int,
                        help="SavedModel version (default: highest existing + 1)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing version or .tflite file")
    add_flags(parser, EXPORT)
    parser.add_argument("--ids-only", action="store_true",
                        help="SavedModel with translate_ids only: loads without tensorflow-text")
    parser.add_argument("--batch-max-rows", type=int, default=BATCH_MAX_ROWS,
                        help="SavedModel: the most sentences that concurrent requests with the "
                        "export's beam and alpha are searched with at once "
                        f"({BATCH_MAX_ROWS}; x beam at most 1024)")
    parser.add_argument("--batch-timeout-ms", type=float, default=BATCH_TIMEOUT_MS,
                        help="SavedModel: how long a request waits for others to share its "
                        f"search, in ms ({BATCH_TIMEOUT_MS:g})")
    parser.add_argument("--batch-threads", type=int, default=BATCH_THREADS,
                        help="SavedModel: batches searched at once, each on a thread of its "
                        f"own ({BATCH_THREADS}: a second search fills the cores a first one "
                        "leaves idle between its small ops)")
    parser.add_argument("--no-batching", action="store_true",
                        help="SavedModel: search each request alone (no BatchFunction op)")
    parser.add_argument("--no-warmup", action="store_true",
                        help="SavedModel: without assets.extra/tf_serving_warmup_requests, the "
                        "request per signature that TensorFlow Serving runs when it loads the "
                        "version (else the first client of each signature waits seconds)")
    parser.set_defaults(run=export)

    parser = commands.add_parser(
        "saved-model-cli",
        help="TensorFlow's saved_model_cli with the tensorflow-text ops loaded",
        description="Runs saved_model_cli (show, run, ...) after importing tensorflow_text, "
        "which the stock saved_model_cli does not, so that `run` works on our SavedModels. "
        f"Example: keras-transformer saved-model-cli run --dir {EXPORT_DIR}/NAME/1 --tag_set "
        "serve --signature_def serving_default --input_exprs 'sentences=[\"A dog runs.\"]'",
    )
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="saved_model_cli arguments")
    parser.set_defaults(run=saved_model_cli)
