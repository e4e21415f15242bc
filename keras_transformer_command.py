"""The `keras-transformer` command's entry point (setup.py's console script).

It sits beside the package, not in it, because of what `import keras_transformer` does: it
registers the package's classes with Keras (so that `keras.models.load_model` reads a saved
model), which imports Keras and TensorFlow. The command must set up its console before
TensorFlow loads (TensorFlow reads TF_CPP_MIN_LOG_LEVEL and TF_ENABLE_ONEDNN_OPTS then, and
writes its start-up notices to descriptor 2: `keras_transformer.console`), and `--help` should
not wait for TensorFlow. So, while this module's `waiting` is True, importing the package
registers nothing; `cli.main` parses the arguments, sets up the console and then registers
(`keras_transformer.register`). Any other importer gets the package's usual behaviour.
"""

import sys

waiting = False  # read by keras_transformer/__init__.py


def main():
    """Runs `keras-transformer` with sys.argv (the process is the command: it owns the
    console) and exits with its status."""
    global waiting
    waiting = "keras_transformer" not in sys.modules  # already imported: nothing to wait for
    from keras_transformer import cli

    waiting = False
    sys.exit(cli.main(own_console=True))


if __name__ == "__main__":  # python -m keras_transformer_command: `waiting` is read by name
    import keras_transformer_command

    keras_transformer_command.main()
