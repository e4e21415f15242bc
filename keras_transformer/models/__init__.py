"""The Transformer model (`transformer.py`), its presets as data (`presets.py`) and an
ensemble of trained models decoded as one (`ensemble.py`).

The names are loaded when first used: the presets (plain data) can be read without importing
Keras, e.g. while the command line builds its flags."""

import importlib

_NAMES = {
    "PRESETS": "presets", "get_preset": "presets", "preset_names": "presets",
    "PAD_ID": "transformer", "Transformer": "transformer",
    "Ensemble": "ensemble",
}

__all__ = sorted(_NAMES)


def __getattr__(name):
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_NAMES))
