"""`keras-transformer` command line: one sub-command per job.

    keras-transformer params --preset base --vocab-size 37000
    keras-transformer presets
    keras-transformer train --preset small --dataset multi30k --train-steps 20000
    keras-transformer average --run-dir runs/multi30k-en-de --last 5
    keras-transformer demo
"""

import argparse
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
    "preset": "model preset (keras-transformer presets)",
    "dropout": "override the preset's P_drop",
    "dataset": "multi30k, wmt14 or text (your own parallel files)",
    "src_lang": "source language", "tgt_lang": "target language",
    "train_src": "dataset text: training source file (plain or .gz)",
    "train_tgt": "dataset text: training target file",
    "dev_src": "dataset text: dev source file", "dev_tgt": "dataset text: dev target file",
    "data_dir": "tensorflow-datasets data directory",
    "source_dir": "Multi30k raw files (default ../shared/data/multi30k, else download)",
    "vocab_size": "shared subword vocabulary size",
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
    "verbose": "Keras progress output: 0 silent, 1 bar, 2 one line per epoch",
}


def _add_config_flags(parser):
    import dataclasses
    import typing

    from keras_transformer.config import TrainConfig

    hints = typing.get_type_hints(TrainConfig)
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        kind = hints[field.name]
        if typing.get_origin(kind) is typing.Union:
            kind = typing.get_args(kind)[0]
        default = field.default
        help_text = f"{CONFIG_HELP.get(field.name, field.name)} (default {default})"
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                                help=help_text)
        else:
            parser.add_argument(flag, type=kind, default=None, metavar=field.name.upper(),
                                help=help_text)


def _train(args):
    import dataclasses

    from keras_transformer.config import TrainConfig, make_config
    from keras_transformer.training import train

    names = [f.name for f in dataclasses.fields(TrainConfig)]
    config = make_config(args.config, **{name: getattr(args, name) for name in names})
    train(config)


def _average(args):
    import json
    import pathlib

    from keras_transformer.checkpoints import average_checkpoints, latest_checkpoints
    from keras_transformer.config import TrainConfig
    from keras_transformer.training import build_model
    from pipelines.tokenizer import SubwordTokenizer

    run_dir = pathlib.Path(args.run_dir)
    config_path = run_dir / "config.json"
    if not config_path.is_file():
        raise ValueError(f"{run_dir} is not a training run directory (no config.json).")
    config = TrainConfig(**json.loads(config_path.read_text()))
    tokenizer = SubwordTokenizer.load(run_dir / "vocab" / "spm.model")
    model = build_model(config, tokenizer.vocab_size)
    paths = latest_checkpoints(run_dir, args.last)
    average_checkpoints(model, paths)
    output = pathlib.Path(args.output or run_dir / "averaged.keras")
    temporary = output.with_name(output.stem + ".tmp.keras")
    model.save(temporary)
    os.replace(temporary, output)
    print(f"averaged {len(paths)} checkpoints ({', '.join(pathlib.Path(p).name for p in paths)})"
          f" into {output}")


def _demo(args):
    from keras_transformer.demo import run_toy_demo

    run_toy_demo(steps=args.steps)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-transformer",
        description="The Transformer of 'Attention Is All You Need' in Keras 3: presets, "
        "training, decoding and export.",
    )
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

    average = commands.add_parser(
        "average",
        help="average the last N checkpoints of a run into one model",
        description="Averages the weights of the last N checkpoints (paper: 5 for base, 20 for "
        "big) and saves the result as a .keras model.",
    )
    average.add_argument("--run-dir", required=True, help="training output directory")
    average.add_argument("--last", type=int, default=5, help="checkpoints to average (5)")
    average.add_argument("--output", help="output file (default RUN_DIR/averaged.keras)")
    average.set_defaults(run=_average)

    demo = commands.add_parser(
        "demo",
        help="smoke demo: train the tiny preset on a generated toy corpus",
        description="Trains the tiny preset for a few steps on a toy corpus this command "
        "writes itself (a placeholder until the Multi30k main job lands).",
    )
    demo.add_argument("--steps", type=int, default=1500, help="training steps (default 1500)")
    demo.set_defaults(run=_demo)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    from keras_transformer.errors import UserError

    try:
        args.run(args)
    except ValueError as error:
        print(f"keras-transformer {args.command}: error: {error}", file=sys.stderr)
        return 2
    except UserError as error:
        print(f"keras-transformer {args.command}: error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
