"""Quiet console for the `keras-transformer` command.

TensorFlow writes start-up notices (oneDNN, CUDA stubs, cuInit) and sentencepiece writes
LOG(INFO) lines straight to file descriptor 2 from C++, before and outside Python's logging. The
command sends that descriptor to /dev/null unless --verbose is given, while Python's sys.stderr
(our messages, warnings, progress bars) keeps writing to the real stderr. It must happen before
TensorFlow is imported, so the package's __init__ calls it when the process is the command.
"""

import logging
import os
import sys


def wants_logs(argv):
    """Whether the command line asks for third-party logs: --verbose (train, prepare:
    --verbose 2 or more)."""
    for i, arg in enumerate(argv):
        if arg == "--verbose":
            value = argv[i + 1] if i + 1 < len(argv) else ""
            return not value.isdigit() or int(value) >= 2
        if arg.startswith("--verbose="):
            value = arg.split("=", 1)[1]
            return value.isdigit() and int(value) >= 2
    return False


def hide_native_logs():
    """Native writes to descriptor 2 go to /dev/null; sys.stderr to the real stderr."""
    sys.stderr.flush()
    real = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)
    sys.stderr = os.fdopen(real, "w", buffering=1, encoding=sys.stderr.encoding,
                           errors="backslashreplace")
    logging.getLogger("absl").setLevel(logging.WARNING)


def is_the_command(argv0):
    return os.path.basename(argv0 or "") == "keras-transformer"


def quiet_unless_verbose(argv):
    """Called by the package when the process is the `keras-transformer` command."""
    if argv and is_the_command(argv[0]) and not wants_logs(argv[1:]):
        hide_native_logs()
