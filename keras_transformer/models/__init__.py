"""The Transformer model (`transformer.py`), its presets as data (`presets.py`) and an
ensemble of trained models decoded as one (`ensemble.py`)."""

from keras_transformer.models.presets import (  # noqa: F401
    ARCHITECTURE_KEYS, PRESETS, get_preset, preset_names, resolve_architecture)
from keras_transformer.models.transformer import PAD_ID, Transformer  # noqa: F401
from keras_transformer.models.ensemble import Ensemble  # noqa: F401,E402
