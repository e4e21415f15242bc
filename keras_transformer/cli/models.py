"""`params` and `presets`: the model presets."""


def params(args):
    from keras_transformer.models import Transformer, get_preset

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


def presets(args):
    from keras_transformer.models.presets import PRESETS

    width = max(map(len, PRESETS))
    for name in sorted(PRESETS):
        print(f"{name:<{width}}  {PRESETS[name]['description']}")


def register(commands):
    parser = commands.add_parser(
        "params",
        help="print a preset's parameter count",
        description="Builds a preset and prints its parameter count by part; the last line is "
        "the total as a bare integer.",
    )
    parser.add_argument("--preset", required=True, help="preset name (see `presets`)")
    parser.add_argument(
        "--vocab-size", type=int, default=37000,
        help="shared source/target vocabulary size (default 37000, the paper's en-de)",
    )
    parser.set_defaults(run=params)

    parser = commands.add_parser("presets", help="list the presets")
    parser.set_defaults(run=presets)
