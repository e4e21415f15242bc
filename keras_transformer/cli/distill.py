"""`keras-transformer distill`: sequence-level distillation (`tasks.distill`). The student's
flags are `train`'s, generated from the settings' declarations, less those distillation
decides (`tasks.distill.DECIDED`: the data and the languages); the teacher's search has its
own few, generated from the decoding request's declaration (`decoding.request`, command
distill)."""

from keras_transformer.decoding.request import DISTILL


def register(commands):
    from keras_transformer.cli.flags import add_flags
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
        "max_length), then tunes it on its dev set as train does (--no-tune skips that). "
        "Every stage resumes: run the same command again after a stop. "
        "A teacher whose own training or dev files have no sentence pair to read is refused "
        "before anything is written. Exit status 75 as for train (preempted after a "
        "checkpoint).",
    )
    parser.add_argument("--teacher", nargs="+", required=True, metavar="RUN",
                        help="the teacher: a run directory or an ensemble's; several are decoded "
                        "as one ensemble")
    add_flags(parser.add_argument_group(
        "the teacher's search", "declared by the decoding request (decoding.request), checked "
        "as translate's; the run's saved choice is the teacher's (several teachers given: the "
        "defaults)"), DISTILL)
    parser.add_argument("--config", help="YAML or JSON file with the student's settings (as "
                        "for train; the data and languages are distillation's)")
    parser.add_argument("--no-tune", action="store_true",
                        help="skip the student's tuning at the end: by default it then chooses "
                        "its weights, alpha and repetition controls on its dev set (the "
                        "teacher's, copied), as train does (STUDENT/decoding.json)")
    parser.add_argument("--continue-stopped", action="store_true",
                        help="train on a student that stopped early, as train "
                        "--continue-stopped does")
    parser.add_argument("--tgt-lang", metavar="LANG",
                        help="a teacher of several target languages: the one pair its student "
                        "learns (the student is a one-pair run of it); a one-pair teacher's "
                        "student has the teacher's languages")
    from keras_transformer.tasks.distill import DECIDED, STUDENT_PRESET

    # The student's defaults that differ from train's, said in their flags' help.
    TrainConfig.add_flags(parser, skip=DECIDED, default_texts={
        "preset": f"default {STUDENT_PRESET}", "vocab_size": "default: the teacher's",
        "max_length": "default: the teacher's", "output_dir": "required"})
    parser.set_defaults(run=_distill)


def _distill(args):
    import json

    from keras_transformer.decoding.request import given_flags
    from keras_transformer.errors import ConfigError
    from keras_transformer.runs.config import TrainConfig, make_config
    from keras_transformer.runs.settings import FLAG

    given = TrainConfig.given(args)
    if "output_dir" not in given:
        raise ConfigError("distill needs --output-dir STUDENT: the student run's directory.")
    requested = make_config(args.config, origin=FLAG, **given)
    from keras_transformer.tasks.distill import distill

    summary = distill(args.teacher, requested, **given_flags(args, DISTILL),
                      continue_stopped=args.continue_stopped, tune=not args.no_tune)
    print(json.dumps(summary))
