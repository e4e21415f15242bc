"""`keras-transformer distill`: sequence-level distillation (`tasks.distill`). The student's
flags are `train`'s, generated from the settings' declarations, less those distillation
decides (`tasks.distill.DECIDED`: the data and the languages); the teacher's search has its
own few."""


def register(commands):
    from keras_transformer.decoding.request import fields
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
    search = parser.add_argument_group("the teacher's search", "declared by the decoding "
                                       "request (decoding.request), checked as translate's")
    options = fields()
    for flag, name, default in (
            ("--beam", "beam_size", "the teacher's saved choice, else {}; several teachers "
             "given: {}"),
            ("--alpha", "alpha", "the teacher's saved choice, else {}"),
            ("--teacher-batch-size", "batch_size", "{}"),
            ("--teacher-precision", "precision", "{}")):
        meta = options[name]
        search.add_argument(flag, type=type(meta["default"]),
                            choices=meta["choices"], metavar=None if meta["choices"] else
                            flag[2:].upper().replace("-", "_"), help=f"{meta['help']} (default: "
                            f"{default.format(meta['default'], meta['default'])})")
    parser.add_argument("--config", help="YAML or JSON file with the student's settings (as "
                        "for train; the data and languages are distillation's)")
    parser.add_argument("--continue-stopped", action="store_true",
                        help="train on a student that stopped early, as train "
                        "--continue-stopped does")
    from keras_transformer.tasks.distill import DECIDED, STUDENT_PRESET

    TrainConfig.add_flags(parser, skip=DECIDED)
    # The student's defaults that differ from train's, said in their flags' help.
    defaults = {"preset": f"default {STUDENT_PRESET}", "vocab_size": "default: the teacher's",
                "max_length": "default: the teacher's", "output_dir": "required"}
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
    from keras_transformer.tasks.distill import distill

    summary = distill(args.teacher, requested, beam_size=args.beam, alpha=args.alpha,
                      batch_size=args.teacher_batch_size, precision=args.teacher_precision,
                      continue_stopped=args.continue_stopped)
    print(json.dumps(summary))
