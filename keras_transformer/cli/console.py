"""The console of the `keras-transformer` command, set up in one place (`setup`), by the command
line's entry point once it has parsed its arguments and before anything imports TensorFlow.

TensorFlow writes start-up notices (oneDNN, CUDA stubs, cuInit) and sentencepiece writes
LOG(INFO) lines straight to file descriptor 2 from C++, before and outside Python's logging. The
command sends that descriptor to /dev/null unless --verbose is given, while Python's sys.stderr
(our messages, warnings, progress bars) keeps writing to the real stderr. Importing the package
changes none of this: only the command does.
"""

import logging
import os
import sys

# Environment defaults of the command (the user's own values win): TensorFlow's C++ logs from
# warnings up hidden, Keras on TensorFlow.
ENVIRONMENT_DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "tensorflow"}


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


def setup(show_native_logs, own_console=True):
    """Sets up the command's console and environment; call before TensorFlow is imported.

    Args:
        show_native_logs: the command line asked for third-party logs (--verbose).
        own_console: the process is the `keras-transformer` command: unless
            show_native_logs, native logs are hidden (`hide_native_logs`), and TensorFlow's
            CPU kernel defaults for this CPU class apply (`hardware.apply_cpu_defaults`).
            False (the command run inside another program): the environment defaults only.
            Both: the persistent XLA compilation cache (`compilation_cache`), which takes
            effect where TensorFlow (JAX) has not loaded yet.
    """
    for name, value in ENVIRONMENT_DEFAULTS.items():
        os.environ.setdefault(name, value)
    from keras_transformer.cli import compilation_cache

    compilation_cache.setup()  # XLA's compiled programs kept between commands
    if not own_console:
        return
    if not show_native_logs:
        hide_native_logs()
    from keras_transformer import hardware

    hardware.apply_cpu_defaults()
