"""Flags that several commands share beside the decoding request's (`decoding.request.
add_flags` generates those), and the rule for TensorFlow-only commands. No heavy imports at
module level: building the parser stays fast."""


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
