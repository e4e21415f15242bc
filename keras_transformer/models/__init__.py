"""The Transformer model (`transformer.py`) and its presets as data (`presets.py`)."""

from keras_transformer.models.presets import (  # noqa: F401
    ARCHITECTURE_KEYS, PRESETS, get_preset, preset_names, resolve_architecture)
from keras_transformer.models.transformer import PAD_ID, Transformer  # noqa: F401
