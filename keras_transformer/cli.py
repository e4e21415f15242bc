"""`keras-transformer` command line: one sub-command per job.

    keras-transformer params --preset base --vocab-size 37000
    keras-transformer presets
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
    try:
        args.run(args)
    except ValueError as error:
        print(f"keras-transformer {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
