"""The checks of decoding options by their old names, kept for the search modules that call
them: each is the decoding request's one check (`decoding.request.check`), which holds every
option's type and range. No heavy imports."""

from keras_transformer.decoding.request import check

_SAMPLING_ORDER = ("num_samples", "top_k", "top_p", "temperature", "seed")


def check_sampling(*values, **named):
    """Raises InputError (a ValueError) naming each sampling option out of its range;
    positional values in the order num_samples, top_k, top_p, temperature, seed."""
    check({**dict(zip(_SAMPLING_ORDER, values)), **named})
