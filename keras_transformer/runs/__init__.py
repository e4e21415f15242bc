"""A run directory and its config: `Run` owns the files (runs/run.py), `TrainConfig` the
settings (runs/config.py; each declared in runs/sections.py), runs/checkpoints.py the
checkpoint files and runs/choices.py the saved decoding choices; an `EnsembleRun` is a
directory of member runs decoded together (`open_run` tells them apart)."""

from keras_transformer.runs.config import TrainConfig, make_config  # noqa: F401
from keras_transformer.runs.run import Run  # noqa: F401
from keras_transformer.runs.ensemble import (  # noqa: F401,E402
    EnsembleRun, open_run, open_single_run)
