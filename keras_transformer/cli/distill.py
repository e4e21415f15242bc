"""`keras-transformer distill`: sequence-level distillation (`tasks.distill`). The student's
flags are `train`'s, generated from the settings' declarations, less those distillation
decides (`tasks.distill.DECIDED`: the data and the languages); the teacher's search has its
own few."""

from keras_transformer.defaults import TRANSLATION


def register(commands):
    from keras_transformer.runs.config import TrainConfig

    parser = commands.add_parser(
        "distill",
        help="sequence-level distillation: a teacher translates its training sources, a "
        "(smaller) student trains on that",
        description="Translates the teacher's training sources with the teacher (one run, or "
        "several decoded as one ensemble) using its saved decoding choice, writes that corpus "
        "and the teacher's dev set into the student run (OUTPUT_DIR/distilled/), records the "
        "teachers in the student's config, and trains the student on it with the settings "
        "below (by default the multi30k-tiny preset, the teacher's vocabulary size and "
        "max_length). Every stage resumes: run the same command again after a stop. "
        "Exit status 75 as for train (preempted after a checkpoint).",
    )
    parser.add_argument("--teacher", nargs="+", required=True, metavar="RUN",
                        help="the teacher: a run directory or an ensemble's; several are decoded "
                        "as one ensemble")
    search = parser.add_argument_group("the teacher's search")
    search.add_argument("--beam", type=int, dest="beam_size",
                        help="beam size (default: the teacher's saved choice, else "
                        f"{TRANSLATION.beam_size}; several teachers given: "
                        f"{TRANSLATION.beam_size})")
    search.add_argument("--alpha", type=float,
                        help="length penalty (default: the teacher's saved choice, else "
                        f"{TRANSLATION.alpha})")
    search.add_argument("--teacher-batch-size", type=int,
                        help=f"sentences per search batch ({TRANSLATION.batch_size})")
    search.add_argument("--teacher-precision", default="auto",
                        choices=("auto", "float32", "bfloat16"),
                        help="what the teacher's search computes in: auto (default) is "
                        "bfloat16 on CPUs with bf16 units, float32 elsewhere")
    parser.add_argument("--config", help="YAML or JSON file with the student's settings (as "
                        "for train; the data and languages are distillation's)")
    from keras_transformer.tasks.distill import DECIDED, STUDENT_PRESET

    TrainConfig.add_flags(parser, skip=DECIDED)
    # The student's defaults that differ from train's, said in their flags' help.
    defaults = {"preset": f"default {STUDENT_PRESET}", "vocab_size": "default: the teacher's",
                "max_length": "default: the teacher's"}
    keys = TrainConfig.keys()
    for action in parser._actions:
        if action.dest in defaults:
            action.help = f"{keys[action.dest][1].metadata['help']} ({defaults[action.dest]})"
    parser.set_defaults(run=_distill)


def _distill(args):
    import json

    from keras_transformer.errors import ConfigError
    from keras_transformer.runs.config import TrainConfig, make_config
    from keras_transformer.runs.settings import FLAG

    given = TrainConfig.given(args)
    if "output_dir" not in given:
        raise ConfigError("distill needs --output-dir STUDENT: the student run's directory.")
    requested = make_config(args.config, origin=FLAG, **given)
    for name, value in (("--beam", args.beam_size), ("--teacher-batch-size",
                                                     args.teacher_batch_size)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} {value} must be at least 1.")
    if args.alpha is not None and args.alpha < 0:
        raise ConfigError(f"--alpha {args.alpha} must be at least 0.")
    from keras_transformer.tasks.distill import distill

    summary = distill(args.teacher, requested, beam_size=args.beam_size, alpha=args.alpha,
                      batch_size=args.teacher_batch_size, precision=args.teacher_precision)
    print(json.dumps(summary))
