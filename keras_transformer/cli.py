"""`keras-transformer` command line: one sub-command per job.

    keras-transformer params --preset base --vocab-size 37000
    keras-transformer presets
    keras-transformer train --preset small --dataset multi30k --train-steps 20000
    keras-transformer average --run-dir runs/multi30k-en-de --last 5
    keras-transformer export --run-dir runs/multi30k-en-de --format savedmodel
    keras-transformer demo

Exit status: 0 done; 2 a user error (bad input, bad config, a missing or damaged file), told
in one line; 1 an internal error, with its traceback under --debug.
"""

import argparse
import contextlib
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def _params(args):
    from keras_transformer import Transformer, get_preset

    preset = get_preset(args.preset)
    model = Transformer.from_preset(args.preset, vocab_size=args.vocab_size)
    model.build()
    print(f"preset {args.preset}: {preset['description']}")
    print("architecture: " + ", ".join(f"{k}={v}" for k, v in preset["model"].items()))
    for label, layer in (
        ("embeddings (shared)", model.source_embedding),
        ("encoder", model.encoder),
        ("decoder", model.decoder),
    ):
        print(f"  {label:<20} {layer.count_params():>13,}")
    total = model.count_params()
    print(f"  {'total':<20} {total:>13,}  ({total / 1e6:.1f}M, vocabulary {args.vocab_size})")
    print(total)


def _presets(args):
    from keras_transformer import PRESETS

    width = max(map(len, PRESETS))
    for name in sorted(PRESETS):
        print(f"{name:<{width}}  {PRESETS[name]['description']}")


CONFIG_HELP = {
    "preset": "model preset (keras-transformer presets); the architecture keys below "
              "change it",
    "num_layers": "architecture: N, layers in the encoder and in the decoder",
    "d_model": "architecture: model width",
    "num_heads": "architecture: attention heads h",
    "d_ff": "architecture: feed-forward inner width",
    "key_dim": "architecture: d_k per head (default d_model / h)",
    "value_dim": "architecture: d_v per head (default d_model / h)",
    "dropout": "architecture: P_drop",
    "norm_first": "architecture: pre-norm residual blocks (the paper: post-norm)",
    "positional": "architecture: sinusoidal (the paper) or learned",
    "dataset": "multi30k, wmt14, text (your own parallel files) or ptb (constituency "
               "parsing on the Penn Treebank sample)",
    "src_lang": "source language", "tgt_lang": "target language",
    "train_src": "dataset text: training source file (plain or .gz)",
    "train_tgt": "dataset text: training target file",
    "dev_src": "dataset text: dev source file", "dev_tgt": "dataset text: dev target file",
    "data_dir": "tensorflow-datasets data directory",
    "source_dir": "Multi30k raw files (default ../shared/data/multi30k, else download); "
                  "for ptb the folder of treebank-combined.tar.gz (../shared/data/ptb-sample)",
    "vocab_size": "shared subword vocabulary size",
    "data_cache": "folder of prepared (tokenized, sharded) training data, shared by runs on the "
                  "same corpus (default $KERAS_TRANSFORMER_DATA_CACHE, else "
                  "~/.cache/keras-transformer/data)",
    "prepared_data": "train from this prepared folder as it is (the folder `prepare` printed; "
                     "e.g. carried to a machine without the corpus or TensorFlow)",
    "shard_pairs": "source pairs per prepared shard (MultiWorker training needs at least one "
                   "shard per worker)",
    "tokens_per_batch": "token budget per side and per replica (paper: 25000)",
    "max_length": "drop pairs longer than this many tokens",
    "pad_to_bucket": "pad batches to bucket boundaries (static shapes for XLA)",
    "train_steps": "optimizer steps (default: the preset's)",
    "warmup_steps": "learning-rate warmup steps (default: the preset's; paper 4000)",
    "label_smoothing": "eps_ls (default: the preset's; paper 0.1)",
    "lr_scale": "multiplier on the paper's learning rate",
    "grad_accum_steps": "batches per optimizer update",
    "precision": "float32, mixed_float16 or mixed_bfloat16",
    "xla": "compile the training step with XLA",
    "seed": "random seed (data order, initialization, dropout)",
    "strategy": "default, mirrored (local GPUs or logical CPUs) or multiworker (TF_CONFIG)",
    "num_replicas": "mirrored on a CPU-only host: number of logical CPU devices",
    "output_dir": "run directory: config, vocabulary, checkpoints, logs, model",
    "checkpoint_minutes": "save a checkpoint every N minutes (paper: 10)",
    "checkpoint_steps": "also save every N steps",
    "keep_checkpoints": "keep the last K checkpoints",
    "eval_steps": "dev loss every N steps (also the progress-bar epoch)",
    "bleu_steps": "greedy dev sacreBLEU every N steps (off by default)",
    "bleu_sentences": "dev sentences used for that BLEU",
    "time_limit_minutes": "stop after this much training time",
    "verbose": "0 quiet, 1 a progress bar over the run's steps, 2 also Keras' line per "
               "eval_steps and third-party logs (TensorFlow, sentencepiece, tfds)",
}


def _add_config_flags(parser, keys=None):
    import dataclasses
    import typing

    from keras_transformer.runs.config import TrainConfig

    hints = typing.get_type_hints(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        if field.name not in CONFIG_HELP:  # set by the program (the resolved architecture)
            continue
        if keys is not None and field.name not in keys:
            continue
        flag = "--" + field.name.replace("_", "-")
        kind = hints[field.name]
        if typing.get_origin(kind) is typing.Union:
            kind = typing.get_args(kind)[0]
        default = field.default
        help_text = f"{CONFIG_HELP[field.name]} (default {default})"
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                                help=help_text)
        else:
            parser.add_argument(flag, type=kind, default=None, metavar=field.name.upper(),
                                help=help_text)


def _train(args):
    import dataclasses

    from keras_transformer.runs.config import TrainConfig, make_config
    from keras_transformer.training.trainer import train

    names = [f.name for f in dataclasses.fields(TrainConfig) if f.name in CONFIG_HELP]
    config = make_config(args.config, **{name: getattr(args, name) for name in names})
    train(config)


PREPARE_KEYS = ("dataset", "src_lang", "tgt_lang", "train_src", "train_tgt", "data_dir",
                "source_dir", "vocab_size", "max_length", "seed", "data_cache", "shard_pairs",
                "verbose")


def _prepare(args):
    from keras_transformer.runs.config import make_config
    from pipelines import datasets, prepared

    config = make_config(args.config, **{key: getattr(args, key) for key in PREPARE_KEYS})
    data = datasets.prepare_training_data(config.dataset, **config.prepared_data_arguments(),
                                          progress=config.verbose > 0, verify=args.check)
    print(prepared.describe(data))
    print(data.directory)


def _average(args):
    from keras_transformer.runs import open_single_run

    run = open_single_run(args.run_dir, "averaging checkpoints")
    model, paths = run.average(args.last, every=args.every)
    output = run.save_model(model, averaged=True, path=args.output)
    print(f"averaged {len(paths)} checkpoints ({', '.join(os.path.basename(p) for p in paths)})"
          f" into {output}")


def _translator(args):
    if getattr(args, "engine", "tensorflow") == "ctranslate2":
        return _ctranslate2_translator(args)
    from keras_transformer.decoding.translate import Translator

    return Translator.from_run(args.run_dir, args.model, beam_size=args.beam, alpha=args.alpha,
                               batch_size=args.batch_size,
                               jit_compile=getattr(args, "xla", False))


def _ctranslate2_translator(args):
    import pathlib

    from keras_transformer.errors import InputError
    from keras_transformer.export.ct2 import CTranslate2Translator, ctranslate2_dirname

    folder = args.ctranslate2_model or (pathlib.Path("saved_models")
                                        / pathlib.Path(args.run_dir).resolve().name
                                        / ctranslate2_dirname("none"))
    if not pathlib.Path(folder).is_dir():
        raise InputError(f"No CTranslate2 export at {folder}: run keras-transformer export "
                         f"--run-dir {args.run_dir} --format ctranslate2 first (or give "
                         "--ctranslate2-model).")
    return CTranslate2Translator(folder, beam_size=args.beam, alpha=args.alpha,
                                 batch_size=args.batch_size)


def _decode_line(raw, number, offset, name):
    """(text, None) for a valid UTF-8 line, else (None, a message naming line and bytes)."""
    try:
        return raw.decode("utf-8").rstrip("\r\n"), None
    except UnicodeDecodeError as error:
        return None, (f"{name}, line {number}: invalid UTF-8 ({error.reason}) at byte "
                      f"{error.start} of the line, byte {offset + error.start} of the input")


def _raw_lines(path):
    """(line number, byte offset, bytes) of a file's lines, or of standard input's."""
    from keras_transformer.errors import InputError

    try:
        handle = open(path, "rb") if path else sys.stdin.buffer
    except FileNotFoundError:
        raise InputError(f"Input file not found: {path}") from None
    offset = 0
    with handle if path else contextlib.nullcontext(handle):
        for number, raw in enumerate(handle, 1):
            yield number, offset, raw
            offset += len(raw)


def _read_lines(path):
    """All lines of a file that must be valid UTF-8 (evaluation inputs): InputError naming the
    first bad line and its byte offsets, before anything is decoded or written."""
    from keras_transformer.errors import InputError

    lines = []
    for number, offset, raw in _raw_lines(path):
        text, problem = _decode_line(raw, number, offset, path)
        if problem:
            raise InputError(f"{problem}. Nothing was translated; convert the file to UTF-8 "
                             "(e.g. iconv -f latin1 -t utf-8).")
        lines.append(text)
    return lines


class _BadLines:
    """Input lines that are not valid UTF-8 (translate, parse): each is named on standard error
    when met and left empty in the output, which keeps one output line per input line; at the
    end `check()` fails the command (exit status 2) naming them all."""

    def __init__(self, name):
        self.name, self.problems = name, []

    def decode(self, number, offset, raw):
        text, problem = _decode_line(raw, number, offset, self.name)
        if problem:
            self.problems.append(problem)
            print(f"keras-transformer: warning: {problem}; its output line is left empty",
                  file=sys.stderr, flush=True)
        return text

    def check(self):
        from keras_transformer.errors import InputError

        if self.problems:
            more = f" (and {len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
            raise InputError(f"{len(self.problems)} input line(s) were not valid UTF-8 and were "
                             f"left empty in the output: {self.problems[0]}{more}.")


def _run_on(function, texts, empty):
    """`function` on the decoded texts; `empty` where a line could not be decoded (None)."""
    done = iter(function([text for text in texts if text is not None]))
    return [empty if text is None else next(done) for text in texts]


def _write_lines(path, lines):
    from keras_transformer.runs.run import write_lines

    write_lines(path, lines)


def _translate(args):
    from pipelines.progress import progress_bar

    translator = _translator(args)
    bad = _BadLines(args.input or "standard input")
    empty = [] if args.nbest else ""
    if args.input:
        sentences = [bad.decode(*line) for line in _raw_lines(args.input)]
        with progress_bar(total=len(sentences), unit=" sentences",
                          disable=args.output is None) as bar:
            results = _run_on(lambda texts: translator.translate(
                texts, nbest=args.nbest, progress=bar), sentences, empty)
        if args.output:
            _write_lines(args.output, _format(results, args))
            print(f"wrote {len(results)} translations to {args.output}", file=sys.stderr)
        else:
            _emit(results, args)
    else:  # stdin: batched when piped, line by line when typed at a terminal
        batch = []
        size = 1 if sys.stdin.isatty() else args.batch_size
        for line in _raw_lines(None):
            batch.append(bad.decode(*line))
            if len(batch) >= size:
                _emit(_run_on(lambda texts: translator.translate(texts, nbest=args.nbest),
                              batch, empty), args)
                batch = []
        if batch:
            _emit(_run_on(lambda texts: translator.translate(texts, nbest=args.nbest), batch,
                          empty), args)
    bad.check()


def _format(results, args):
    if not args.nbest:
        return results
    return [f"{i}\t{score:.4f}\t{text}" for i, hyps in enumerate(results) for text, score in hyps]


def _emit(results, args):
    for line in _format(results, args):
        print(line, flush=True)


def _evaluate(args):
    import json
    import pathlib

    from pipelines.progress import progress_bar

    from keras_transformer.errors import InputError
    from keras_transformer.evaluation.bleu import score
    from keras_transformer.runs import open_run
    from pipelines import datasets

    run = open_run(args.run_dir)  # an ensemble's directory too
    translator = _translator(args)
    config = run.config
    official = None  # the official tokenized references (Multi30k val / test2016)
    if args.src:
        if not args.ref:
            raise InputError("--src needs --ref (the reference translations).")
        sources_text, references = _read_lines(args.src), _read_lines(args.ref)
        if len(sources_text) != len(references):
            raise InputError(f"{args.src} has {len(sources_text)} lines but {args.ref} has "
                             f"{len(references)}.")
        name = pathlib.Path(args.src).name
    else:
        sources_text, references = datasets.split_texts(config.dataset, args.split,
                                                        **config.data_arguments())
        name = f"{config.dataset} {args.split} {config.src_lang}-{config.tgt_lang}"
        official = datasets.official_tokenized_references(config.dataset, args.split,
                                                          config.tgt_lang, config.source_dir)
    with progress_bar(total=len(sources_text), unit=" sentences") as bar:
        hypotheses = translator.translate(sources_text, progress=bar)
    output = args.output or run.hypotheses_path(args.split, args.beam)
    _write_lines(output, hypotheses)
    result = score(hypotheses, references, lang=config.tgt_lang, tokenized_references=official)
    print(f"{name}: {len(hypotheses)} sentences, beam {args.beam}, alpha {args.alpha}; "
          f"hypotheses in {output}")
    for line in result.pop("lines"):
        print(line)
    print(json.dumps({"set": name, "beam": args.beam, "alpha": args.alpha, **result}))


def _attention(args):
    _tensorflow_only("attention", "run it with KERAS_BACKEND=tensorflow")
    import pathlib

    import tensorflow as tf

    from keras_transformer.evaluation.attention_maps import KINDS, attention_weights, plot
    from keras_transformer.runs import open_single_run

    run = open_single_run(args.run_dir, "an attention picture")
    translator = _translator(args)
    tokenizer = run.tokenizer()
    source = translator.encode([args.sentence])[0]
    source_ids = tf.constant([source], tf.int32)
    output = translator._search(source_ids)["ids"][:, 0]
    weights = attention_weights(translator.model, tokenizer, source_ids, output)
    kinds = KINDS if args.kind == "all" else (args.kind,)
    layers = len(weights["encoder"])
    layer = layers - 1 if args.layer is None else args.layer - 1
    folder = pathlib.Path(args.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    print("translation: " + translator.vocabulary.decode(output)[0])
    for kind in kinds:
        path = plot(weights, kind, layer, args.head - 1,
                    folder / f"attention-{kind}-layer{layer + 1}-head{args.head}.png")
        print(f"wrote {path}")


def _add_run_flags(parser):
    parser.add_argument("--run-dir", required=True, help="training output directory")
    parser.add_argument("--model", help="model file (default: RUN_DIR/averaged.keras if it "
                        "exists, else RUN_DIR/model.keras)")


def _add_engine_flags(parser):
    parser.add_argument("--engine", default="tensorflow", choices=("tensorflow", "ctranslate2"),
                        help="tensorflow: our search on the run's Keras model (default); "
                        "ctranslate2: the run's CTranslate2 export (keras-transformer export "
                        "--format ctranslate2), whose --alpha divides scores by length^alpha "
                        "instead of the GNMT penalty")
    parser.add_argument("--xla", action="store_true",
                        help="tensorflow engine: compile the search with XLA (1.3-1.4x faster "
                        "per batch on CPU, after a compilation of seconds for each batch "
                        "shape; worth it for large inputs)")
    parser.add_argument("--ctranslate2-model", help="CTranslate2 export folder for --engine "
                        "ctranslate2 (default saved_models/RUN_NAME/ctranslate2; e.g. "
                        "saved_models/RUN_NAME/ctranslate2-int8 for the int8 one)")


def _add_io_flags(parser):
    parser.add_argument("--input", help="input file (default: standard input)")
    parser.add_argument("--output", help="output file (default: standard output)")


def _add_model_flags(parser, search=None, alpha_hint=""):
    from keras_transformer.defaults import TRANSLATION

    search = search or TRANSLATION
    _add_run_flags(parser)
    parser.add_argument("--beam", type=int, default=search.beam_size,
                        help=f"beam size ({search.beam_size}; 1 = greedy)")
    parser.add_argument("--alpha", type=float, default=search.alpha,
                        help=f"length penalty ({search.alpha}{alpha_hint})")
    parser.add_argument("--batch-size", type=int, default=search.batch_size,
                        help=f"sentences per batch ({search.batch_size})")


def _tensorflow_only(what, instead):
    """Refuses a TensorFlow-only command or option under another backend, saying what to do."""
    import keras

    from keras_transformer.errors import ConfigError

    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ConfigError(f"{what} runs under TensorFlow only (this process runs Keras on "
                          f"{backend}): {instead}.")


def _export(args):
    _tensorflow_only("export", "run it again with KERAS_BACKEND=tensorflow on a machine with "
                     "TensorFlow (runs trained under JAX export as they are)")
    import logging

    from absl import logging as absl_logging

    from keras_transformer.export import export_run

    # TensorFlow logs every renamed function input while saving; keep the output readable.
    absl_logging.set_verbosity(absl_logging.WARNING)
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    path = export_run(
        args.run_dir, format=args.format, quantize=args.quantize, output_dir=args.output_dir,
        name=args.name, version=args.version, overwrite=args.overwrite, beam_size=args.beam,
        alpha=args.alpha, model_file=args.model, ids_only=args.ids_only,
    )
    print(f"exported {args.format} to {path}")


def _saved_model_cli(args):
    _tensorflow_only("saved-model-cli", "run it with KERAS_BACKEND=tensorflow")
    import tensorflow_text  # noqa: F401  (registers the sentencepiece ops the graph uses)
    from tensorflow.python.tools import saved_model_cli

    sys.argv = ["saved_model_cli", *args.arguments]
    saved_model_cli.main()


def _parse(args):
    import json

    from pipelines.progress import progress_bar

    from keras_transformer.tasks.parsing import Parser, evaluate_run
    from pipelines.treebank import to_string

    options = dict(model_file=args.model, beam_size=args.beam, alpha=args.alpha,
                   batch_size=args.batch_size)
    if args.evaluate:
        with progress_bar(unit=" sentences", desc=f"parsing {args.evaluate}") as bar:
            scores, trees = evaluate_run(args.run_dir, args.evaluate, progress=bar, **options)
        if args.output:
            _write_lines(args.output, [to_string(tree) for tree in trees])
        print(f"PTB sample {args.evaluate}: labeled precision {scores['precision']:.2f}, recall "
              f"{scores['recall']:.2f}, F1 {scores['f1']:.2f}, exact match "
              f"{scores['exact_match']:.2f} ({scores['sentences']} sentences; EVALB convention: "
              "punctuation and the root ignored)")
        print(json.dumps({"split": args.evaluate, "beam": args.beam, "alpha": args.alpha,
                          **scores}))
        return
    bad = _BadLines(args.input or "standard input")
    lines = [bad.decode(*line) for line in _raw_lines(args.input)]
    parser = Parser.from_run(args.run_dir, **options)
    trees = _run_on(lambda texts: parser.parse([" ".join(text.split()) for text in texts]),
                    lines, None)
    output = [to_string(tree) if line and line.strip() else ""
              for line, tree in zip(lines, trees)]
    if args.output:
        _write_lines(args.output, output)
    else:
        print("\n".join(output))
    bad.check()


def _demo(args):
    from keras_transformer.tasks.main_job import run

    run(full=args.full, src_lang=args.src_lang, tgt_lang=args.tgt_lang,
        output_dir=args.output_dir, export_dir=args.export_dir, train_steps=args.train_steps)


EXIT_STATUS = ("exit status: 0 done; 2 a user error (bad input, bad config, a missing or "
               "damaged file), told in one line; 1 an internal error (run again with --debug "
               "for its traceback).")


def build_parser():
    from keras_transformer.defaults import PARSING, TRANSLATION

    parser = argparse.ArgumentParser(
        prog="keras-transformer",
        description="The Transformer of 'Attention Is All You Need' in Keras 3: presets, "
        "training, decoding and export.",
        epilog=EXIT_STATUS,
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (also KERAS_TRANSFORMER_DEBUG=1)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    params = commands.add_parser(
        "params",
        help="print a preset's parameter count",
        description="Builds a preset and prints its parameter count by part; the last line is "
        "the total as a bare integer.",
    )
    params.add_argument("--preset", required=True, help="preset name (see `presets`)")
    params.add_argument(
        "--vocab-size", type=int, default=37000,
        help="shared source/target vocabulary size (default 37000, the paper's en-de)",
    )
    params.set_defaults(run=_params)

    presets = commands.add_parser("presets", help="list the presets")
    presets.set_defaults(run=_presets)

    train = commands.add_parser(
        "train",
        help="train a model with model.fit (the paper's recipe)",
        description="Trains a Transformer with Adam and the paper's warmup schedule, "
        "label-smoothed loss, token-budget batches, periodic checkpoints and dev evaluation. "
        "Run the same command again to resume a stopped run from its last checkpoint.",
    )
    train.add_argument("--config", help="YAML or JSON file with any of the keys below; "
                       "flags override it")
    _add_config_flags(train)
    train.set_defaults(run=_train)

    prepare = commands.add_parser(
        "prepare",
        help="tokenize a training corpus once into the data cache (train does it when needed)",
        description="Reads a dataset's training pairs, trains the shared vocabulary on a "
        "bounded sample, tokenizes on every core and writes shards of integer ids with the "
        "corpus statistics into the data cache, where every run on the same corpus, vocabulary "
        "settings and max_length finds them. A killed prepare, started again, keeps its "
        "finished shards. Prints a summary and, last, the prepared folder.",
    )
    prepare.add_argument("--config", help="YAML or JSON file with any of the keys below "
                         "(a training config works: other keys are ignored)")
    prepare.add_argument("--check", action="store_true",
                         help="verify the checksum of every shard of data found prepared, and "
                         "prepare damaged ones again (missing or truncated shards are always "
                         "found)")
    _add_config_flags(prepare, PREPARE_KEYS)
    prepare.set_defaults(run=_prepare)

    average = commands.add_parser(
        "average",
        help="average the last N checkpoints of a run into one model",
        description="Averages the weights of the last N checkpoints (paper: 5 for base, 20 for "
        "big) and saves the result as a .keras model.",
    )
    average.add_argument("--run-dir", required=True, help="training output directory")
    average.add_argument("--last", type=int, default=5, help="checkpoints to average (5)")
    average.add_argument("--every", type=int, default=1,
                         help="take every N-th checkpoint counting back from the newest, for "
                         "averages spread over more steps (1: the last K in a row)")
    average.add_argument("--output", help="output file (default RUN_DIR/averaged.keras)")
    average.set_defaults(run=_average)

    translate = commands.add_parser(
        "translate",
        help="translate text with a trained run (stdin to stdout, or files)",
        description="Translates one sentence per line with beam search (beam "
        f"{TRANSLATION.beam_size}, alpha {TRANSLATION.alpha}, maximum length input + "
        f"{TRANSLATION.extra_length}). Empty lines give empty lines; inputs longer than the "
        "run's max_length (subword tokens) are truncated with a warning.",
    )
    _add_model_flags(translate)
    _add_engine_flags(translate)
    _add_io_flags(translate)
    translate.add_argument("--nbest", action="store_true",
                           help="print every beam hypothesis as: line, score, text")
    translate.set_defaults(run=_translate)

    evaluate = commands.add_parser(
        "evaluate",
        help="translate a test set and print sacreBLEU, chrF, tokenized and literature BLEU",
        description="Decodes a test set (the run's dataset split, or --src/--ref files), writes "
        "the hypotheses and prints sacreBLEU with its signature, chrF, the paper-style "
        "tokenized BLEU with compound splitting, and BLEU in the Multi30k literature "
        "convention (lowercased, Moses-normalized and -tokenized text against the official "
        "*.lc.norm.tok.* references when the split has them, else the references normalized "
        "the same way). Only sacreBLEU is comparable across papers and tools.",
    )
    _add_model_flags(evaluate)
    _add_engine_flags(evaluate)
    evaluate.add_argument("--split", default="test", choices=("dev", "test"),
                          help="which split of the run's dataset (test)")
    evaluate.add_argument("--src", help="source file instead of the run's dataset")
    evaluate.add_argument("--ref", help="reference file for --src")
    evaluate.add_argument("--output", help="hypotheses file (default RUN_DIR/hyp.SPLIT.beamK.txt)")
    evaluate.set_defaults(run=_evaluate)

    attention = commands.add_parser(
        "attention",
        help="draw attention heat maps for a sentence (like the paper's Figures 3-5)",
        description="Translates the sentence, then writes PNG heat maps of one head's attention "
        "weights: encoder self-attention, decoder self-attention and encoder-decoder attention.",
    )
    _add_model_flags(attention)
    attention.add_argument("sentence", help="source sentence")
    attention.add_argument("--layer", type=int, help="layer, from 1 (default: the last)")
    attention.add_argument("--head", type=int, default=1, help="head, from 1 (1)")
    attention.add_argument("--kind", default="all", choices=("all", "encoder", "decoder", "cross"))
    attention.add_argument("--output-dir", default=".", help="where the PNG files go")
    attention.set_defaults(run=_attention)

    export = commands.add_parser(
        "export",
        help="export a trained run as a SavedModel (TensorFlow Serving), TFLite or CTranslate2 "
        "model",
        description="SavedModel: OUTPUT_DIR/NAME/VERSION/ with the signatures serving_default "
        "(strings in, translations and scores out; beam_size and alpha optional inputs, "
        f"defaults {TRANSLATION.beam_size} and {TRANSLATION.alpha}) and translate_ids (int32 ids in and out, core TensorFlow ops "
        "only). TFLite: OUTPUT_DIR/NAME/tflite/translator-<search>-<quantization>.tflite, ids "
        "in and out for one sentence, with spm.model beside it. CTranslate2: "
        "OUTPUT_DIR/NAME/ctranslate2[-QUANTIZE]/ for CTranslate2's Translator (and "
        "`keras-transformer translate --engine ctranslate2`), spm.model inside; needs the "
        "ctranslate2 extra (pip install 'keras-transformer[ctranslate2]'). Files are written "
        "under a temporary name and renamed when complete.",
    )
    _add_run_flags(export)
    export.add_argument("--format", default="savedmodel",
                        choices=("savedmodel", "tflite", "ctranslate2"),
                        help="savedmodel (default), tflite or ctranslate2")
    export.add_argument("--quantize", default="none",
                        choices=("none", "dynamic", "float16", "int8", "int8_float32"),
                        help="weights: none (float32); TFLite: dynamic (int8 weights) or "
                        "float16; CTranslate2: int8, int8_float32 or float16")
    export.add_argument("--output-dir", default="saved_models",
                        help="base directory (default saved_models)")
    export.add_argument("--name", help="model name (default: the run directory's name)")
    export.add_argument("--version", type=int,
                        help="SavedModel version (default: highest existing + 1)")
    export.add_argument("--overwrite", action="store_true",
                        help="replace an existing version or .tflite file")
    export.add_argument("--beam", type=int, default=TRANSLATION.beam_size,
                        help=f"beam size fixed in the TFLite search and the SavedModel's "
                        f"translate_ids_xla signature ({TRANSLATION.beam_size}; TFLite: 1 = "
                        "greedy)")
    export.add_argument("--alpha", type=float, default=TRANSLATION.alpha,
                        help=f"TFLite search: length penalty ({TRANSLATION.alpha})")
    export.add_argument("--ids-only", action="store_true",
                        help="SavedModel with translate_ids only: loads without tensorflow-text")
    export.set_defaults(run=_export)

    smcli = commands.add_parser(
        "saved-model-cli",
        help="TensorFlow's saved_model_cli with the tensorflow-text ops loaded",
        description="Runs saved_model_cli (show, run, ...) after importing tensorflow_text, "
        "which the stock saved_model_cli does not, so that `run` works on our SavedModels. "
        "Example: keras-transformer saved-model-cli run --dir saved_models/NAME/1 --tag_set "
        "serve --signature_def serving_default --input_exprs 'sentences=[\"A dog runs.\"]'",
    )
    smcli.add_argument("arguments", nargs=argparse.REMAINDER, help="saved_model_cli arguments")
    smcli.set_defaults(run=_saved_model_cli)

    parse = commands.add_parser(
        "parse",
        help="constituency parsing with a run trained on --dataset ptb (sentences -> trees)",
        description="Parses one whitespace-tokenized sentence per line (PTB style: 'The dog "
        f"runs .') into a bracketed tree, with the paper's parsing search: beam "
        f"{PARSING.beam_size}, alpha {PARSING.alpha}, maximum output length input + "
        f"{PARSING.extra_length}. Malformed model output is repaired "
        "deterministically. --evaluate SPLIT parses the PTB sample's dev or test files instead "
        "and prints labeled bracketing precision, recall, F1 and exact match (EVALB convention).",
    )
    _add_model_flags(parse, PARSING,
                     alpha_hint=", the paper's; larger values give more brackets: pick it with "
                     "--evaluate dev, e.g. 1.0-1.5 on the PTB sample")
    _add_io_flags(parse)
    parse.add_argument("--evaluate", choices=("dev", "test"),
                       help="score the PTB sample's dev or test split instead of reading input")
    parse.set_defaults(run=_parse)

    from keras_transformer.tasks.main_job import FULL, QUICK, members, recipe  # no TensorFlow

    demo = commands.add_parser(
        "demo",
        help="the main job: Multi30k vocabulary, training, averaging, test2016 BLEU, export",
        description="Runs the whole main job on Multi30k (../shared/data/multi30k if present, "
        "else downloaded): builds the vocabulary, trains for a fixed number of optimizer steps "
        f"(quick: {QUICK['train_steps']} steps of the {QUICK['preset']} preset with "
        f"{QUICK['num_layers']} layers and P_drop {QUICK['dropout']}, about 25 minutes of "
        f"training on 2 cores of an AVX2 AMD EPYC; --full: {FULL['train_steps']} steps of the "
        "3-layer preset, for en-de an ensemble of three models), "
        "picks the final weights or an average of checkpoints and the length penalty on val, "
        f"evaluates test2016 (--full: val too) with beam {TRANSLATION.beam_size} (sacreBLEU, "
        "chrF and the Multi30k literature's BLEU), exports a SavedModel under saved_models/, "
        "translates example sentences through it and prints a summary. Running it again on a "
        "finished run skips the training; on a killed one, resumes it.",
    )
    ensemble = ", ".join(name for name, _ in members(True, "de"))
    demo.add_argument("--full", action="store_true",
                      help=f"the full recipe: {FULL['train_steps']} steps of the 3-layer preset "
                      f"with P_drop {FULL['dropout']}, about 150 minutes of training on 2 AVX2 "
                      f"AMD EPYC cores; for en-de an ensemble of three such runs ({ensemble}: "
                      f"layers and P_drop) trained one after the other into RUN_DIR/members/, "
                      f"about 420 minutes; en-fr one model with P_drop "
                      f"{recipe(True, 'fr')['dropout']}. Resumable pieces if need be")
    demo.add_argument("--src-lang", default="en", help="source language (en)")
    demo.add_argument("--tgt-lang", default="de", choices=("de", "fr"),
                      help="target language (de)")
    demo.add_argument("--train-steps", type=int,
                      help="override the recipe's optimizer steps (quick "
                      f"{QUICK['train_steps']}, full {FULL['train_steps']})")
    demo.add_argument("--output-dir", help="run directory (default "
                      "runs/multi30k-SRC-TGT-quick or -full)")
    demo.add_argument("--export-dir", default="saved_models",
                      help="SavedModel base directory (saved_models)")
    demo.set_defaults(run=_demo)
    for command in commands.choices.values():  # --debug after the command name works too
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the traceback of an error")
        if not any(action.dest == "verbose" for action in command._actions):
            command.add_argument("--verbose", action="store_true",
                                 help="show third-party logs (TensorFlow's start-up notices, "
                                 "sentencepiece, tfds progress)")
    return parser


def console_main():
    """The `keras-transformer` command (third-party logs are hidden unless --verbose, see
    `keras_transformer.console`)."""
    sys.exit(main())


def main(argv=None):
    args = build_parser().parse_args(argv)
    debug = args.debug or bool(os.environ.get("KERAS_TRANSFORMER_DEBUG"))
    from keras_transformer.errors import UserError
    from pipelines.errors import DataError

    try:
        args.run(args)
    except (UserError, DataError, FileNotFoundError) as error:
        if debug:
            raise
        print(f"keras-transformer {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"keras-transformer {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001  (internal: one line unless --debug)
        if debug:
            raise
        print(f"keras-transformer {args.command}: internal error: {type(error).__name__}: "
              f"{error} (run again with --debug for the traceback)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    console_main()
