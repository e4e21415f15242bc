"""The graph search bodies, one per mode (see `keras_transformer.decoding`)."""
