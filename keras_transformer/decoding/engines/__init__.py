"""The decoding engines under one text layer (see `keras_transformer.decoding`)."""
