"""One helper for layer tests: output shape, weight count and get_config round trip."""

import keras
import numpy as np


def check_layer(layer, args, kwargs=None, expected_shape=None, expected_weights=None):
    """Calls `layer`, then rebuilds it from its config and checks identical outputs.

    Returns the layer's output (the first element when it returns a tuple).
    """
    kwargs = kwargs or {}
    output = layer(*args, **kwargs)
    first = output[0] if isinstance(output, tuple) else output
    if expected_shape is not None:
        assert tuple(first.shape) == tuple(expected_shape)
    if expected_weights is not None:
        assert len(layer.weights) == expected_weights

    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    clone(*args, **kwargs)
    clone.set_weights(layer.get_weights())
    clone_output = clone(*args, **kwargs)
    clone_first = clone_output[0] if isinstance(clone_output, tuple) else clone_output
    np.testing.assert_allclose(np.asarray(first), np.asarray(clone_first), rtol=1e-6, atol=1e-6)

    # Registered as serializable: the generic Keras (de)serializer finds the class.
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is type(layer)
    return first
