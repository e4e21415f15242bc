"""keras-transformer: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017)."""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from keras_transformer import layers, loss, metrics, optimizer, schedule  # noqa: E402,F401  (registers)
from keras_transformer.model import PAD_ID, Transformer  # noqa: E402
from keras_transformer.presets import PRESETS, get_preset, preset_names  # noqa: E402

__version__ = "0.1.0"

__all__ = ["PAD_ID", "PRESETS", "Transformer", "get_preset", "layers", "preset_names"]
