"""The flags of the commands: the decoding request's, generated from its declaration
(`add_flags`: one flag per option a command takes, `decoding.request`), those several commands
share beside them, and the rule for TensorFlow-only commands. No heavy imports at module level:
building the parser stays fast."""

import argparse
import typing

from keras_transformer.decoding import request
from keras_transformer.runs.settings import Range



def add_run_flags(parser):
    parser.add_argument("--run-dir", required=True, help="training output directory")


def add_io_flags(parser):
    parser.add_argument("--input", help="input file (default: standard input)")
    parser.add_argument("--output", help="output file (default: standard output)")


def tensorflow_only(what, instead):
    """Refuses a TensorFlow-only command or option under another backend, saying what to do."""
    import keras

    from keras_transformer.errors import ConfigError

    backend = keras.backend.backend()
    if backend != "tensorflow":
        raise ConfigError(f"{what} runs under TensorFlow only (this process runs Keras on "
                          f"{backend}): {instead}.")


def add_flags(parser, command):
    """Adds the flags of `command`, one per option that has it, each defaulting to None (so
    that `request.given_flags` tells what was given); --help says the command's default
    (`request.command_defaults`: parse's search is the parsing one)."""
    hints = typing.get_type_hints(request.Request)
    defaults = request.command_defaults(command)
    groups = {}
    for name, meta in request.fields().items():
        if command not in meta["commands"]:
            continue
        kind = hints[name]
        kind = typing.get_args(kind)[0] if typing.get_origin(kind) is typing.Union else kind
        default = defaults.get(name)
        shown = default if default is not None else (meta["default_text"]
                                                     or f"default {meta['default']}")
        options = dict(default=None, help=f"{meta['help']} ({shown})")
        if kind is bool:  # a switch; one whose default is None (auto) has --no-NAME too
            options["action"] = ("store_true" if meta["default"] is not None
                                 else argparse.BooleanOptionalAction)
        else:
            options.update(type=kind, metavar=meta["metavar"] or name.upper())
            if meta["choices"]:
                options.update(choices=meta["choices"], metavar=None)
        if meta["check"] is not None and isinstance(meta["check"], Range):
            options["help"] = options["help"][:-1] + f"; {meta['check'].rule()})"
        if meta["mode"] == request.SAMPLE and request.SAMPLE not in groups:
            groups[request.SAMPLE] = parser.add_argument_group(
                "sampling", "with --sample: draw each token from the model's distribution "
                "instead of searching")
        target = groups[request.SAMPLE] if meta["mode"] == request.SAMPLE else parser
        target.add_argument(request.flag_name(name, command),
                            dest=request.flag_dest(name, command), **options)
