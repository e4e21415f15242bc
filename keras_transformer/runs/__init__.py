"""A run directory and its config: `Run` owns the files, `TrainConfig` the settings."""

from keras_transformer.runs.config import TrainConfig, make_config  # noqa: F401
from keras_transformer.runs.run import Run  # noqa: F401
