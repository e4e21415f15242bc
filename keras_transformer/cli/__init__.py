"""`keras-transformer` command line: one sub-command per job, one module per command family.

    keras-transformer params --preset base --vocab-size 37000
    keras-transformer presets
    keras-transformer train --preset small --dataset multi30k --train-steps 20000
    keras-transformer average --run-dir runs/multi30k-en-de --last 5
    keras-transformer export --run-dir runs/multi30k-en-de --format savedmodel
    keras-transformer distill --teacher runs/multi30k-en-de --output-dir runs/student
    keras-transformer tune --run-dir runs/multi30k-en-de --src dev.en --ref dev.de
    keras-transformer demo

    models.py   params, presets          decode.py   translate, evaluate, attention, parse
    train.py    train, prepare           export.py   average, export, saved-model-cli
    demo.py     demo                     flags.py    the flags several commands share
    score.py    score                    distill.py  distill
    tune.py     tune
    serve.py    serve

Each module's `register(commands)` adds its parsers, each with `set_defaults(run=function)`;
a command function calls the library and prints. Nothing heavy is imported to build the
parser, so `--help` is fast, and the console is set up (`console.setup`) from the parsed
arguments before anything imports TensorFlow: the command's entry point
(`keras_transformer_command`, beside the package) imports the package without its Keras
registration, which `main` does after the console is set up.

Exit status: 0 done; 2 a user error (bad input, bad config, a missing or damaged file, no
space left, a run another process writes), told in one line; 75 (EX_TEMPFAIL) `train` or
`distill` stopped by SIGTERM or SIGINT after saving a checkpoint, resumed by running the same
command (training/preemption.py); 130 interrupted otherwise; 1 an internal error, with its
traceback under --debug.
"""

import argparse
import contextlib
import os
import sys

from keras_transformer.cli import console, lean_start
from keras_transformer.cli import (decode, demo, distill, export, models, score, serve, train,
                                   tune)

# In the order `keras-transformer --help` lists them.
FAMILIES = (models, train, tune, export, decode, score, serve, distill, demo)

EXIT_STATUS = ("exit status: 0 done; 2 a user error (bad input, bad config, a missing or "
               "damaged file, no space left, a run another process writes), told in one line; "
               "75 train stopped by SIGTERM/SIGINT after saving a checkpoint (run the same "
               "command to resume); 1 an internal error (run again with --debug for its "
               "traceback).")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-transformer",
        description="The Transformer of 'Attention Is All You Need' in Keras 3: presets, "
        "training, decoding and export.",
        epilog=EXIT_STATUS,
    )
    parser.add_argument("--debug", action="store_true",
                        help="show the traceback of an error (also KERAS_TRANSFORMER_DEBUG=1)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for family in FAMILIES:
        family.register(commands)
    for command in commands.choices.values():  # --debug after the command name works too
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show the traceback of an error")
        try:
            command.add_argument("--verbose", action="store_true",
                                 help="show third-party logs (TensorFlow's start-up notices, "
                                 "sentencepiece, tfds progress)")
        except argparse.ArgumentError:  # train and prepare have their own: --verbose N
            pass
    return parser


def shows_native_logs(args):
    """--verbose (the helper commands) or --verbose 2 and more (train, prepare)."""
    verbose = getattr(args, "verbose", None)
    return verbose is True or (isinstance(verbose, int) and not isinstance(verbose, bool)
                               and verbose >= 2)


def uses_keras(args):
    """Whether the command needs Keras: all but those run by the CTranslate2 engine
    (translate, evaluate, score with --engine ctranslate2), which import neither Keras nor
    TensorFlow and start as a small Python program does, and `serve`, which registers them
    itself once it knows its engines."""
    if getattr(args, "registers_keras", False):
        return False
    return getattr(args, "engine", None) != "ctranslate2"


def console_main():
    """The `keras-transformer` command: the console is the command's (third-party logs hidden
    unless --verbose, see `keras_transformer.cli.console`). The installed command enters through
    `keras_transformer_command.main`, which gets here before the package imports TensorFlow;
    a process that has already imported the package has TensorFlow's start-up notices."""
    sys.exit(main(own_console=True))


def main(argv=None, own_console=False):
    """Runs the command `argv` (default sys.argv[1:]); returns its exit status.

    own_console: the process is the command (`console_main`): native logs go to /dev/null
    unless --verbose, and TensorFlow's CPU kernel defaults apply. Otherwise (tests, scripts,
    `python -m keras_transformer.cli`) only the environment defaults are set. In the command's
    own process TensorFlow and Keras also load without their optional imports of JAX and
    matplotlib (`keras_transformer.cli.lean_start`).
    """
    args = build_parser().parse_args(argv)
    console.setup(shows_native_logs(args), own_console=own_console)
    if uses_keras(args):
        import keras_transformer

        with (lean_start.without_optional_imports() if own_console
              else contextlib.nullcontext()):
            keras_transformer.register()  # the saved classes (deferred by the entry point)
    debug = args.debug or bool(os.environ.get("KERAS_TRANSFORMER_DEBUG"))
    from keras_transformer.errors import UserError
    from pipelines.errors import DataError, NoSpaceError

    try:
        args.run(args)
    except (UserError, DataError, NoSpaceError, FileNotFoundError) as error:
        status = getattr(error, "exit_status", 2)  # 75: preempted, with a checkpoint
        if debug and status == 2:
            raise
        print(f"keras-transformer {args.command}: {'error: ' if status == 2 else ''}{error}",
              file=sys.stderr)
        return status
    except KeyboardInterrupt:
        print(f"keras-transformer {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001  (internal: one line unless --debug)
        if debug:
            raise
        from pipelines.files import no_space

        if no_space(error):  # a write outside the atomic writer (a temporary folder, logs)
            print(f"keras-transformer {args.command}: error: no space left on the device "
                  f"({type(error).__name__}: {error}); free some space (or raise the limit) "
                  "and run the same command again", file=sys.stderr)
            return 2
        print(f"keras-transformer {args.command}: internal error: {type(error).__name__}: "
              f"{error} (run again with --debug for the traceback)", file=sys.stderr)
        return 1
    return 0
