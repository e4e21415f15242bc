"""The file-level jobs of the decoding commands (see `keras_transformer.decoding`)."""
