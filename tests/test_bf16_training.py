"""A run trained under mixed_bfloat16 keeps float32 checkpoints: it resumes, averages and
exports like a float32 one (on any CPU class: the tiny model is cheap even where bf16 is
slow)."""

import json

import h5py
import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer.runs import Run
from keras_transformer.training import train
from tests.conftest import toy_config


def _weight_dtypes(path):
    dtypes = set()
    with h5py.File(path, "r") as handle:
        handle.visititems(lambda name, item: dtypes.add(item.dtype) if isinstance(
            item, h5py.Dataset) and item.dtype.kind == "f" else None)
    return dtypes


@pytest.fixture
def global_policy_restored():
    import keras

    yield
    keras.mixed_precision.set_global_policy("float32")  # train() sets the process's policy


@pytest.mark.slow  # trains 15 steps in two pieces, averages, exports (about 40 CPU-s)
def test_a_bf16_run_resumes_averages_and_exports_with_float32_checkpoints(
        toy_corpus, runtime_preset, tmp_path, global_policy_restored):
    run_dir = tmp_path / "run"
    first = train(toy_config(toy_corpus, run_dir, precision="mixed_bfloat16", train_steps=10,
                             checkpoint_steps=5))
    assert first["precision"] == "mixed_bfloat16" and first["step"] == 10
    run = Run(run_dir)
    for path in run.checkpoints():
        assert _weight_dtypes(path) == {np.dtype("float32")}, path
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["optimization"]["precision"] == "mixed_bfloat16"

    # Resumed by a command that leaves the precision to the machine: the run's is kept.
    resumed = train(toy_config(toy_corpus, run_dir, precision="auto", train_steps=15))
    assert (resumed["start_step"], resumed["step"], resumed["precision"]) == \
        (10, 15, "mixed_bfloat16")

    assert cli.main(["average", "--run-dir", str(run_dir), "--last", "2"]) == 0
    model = Run(run_dir).load_model()
    assert {v.dtype for v in model.weights} == {"float32"}
    assert model.dtype_policy.name == "float32"  # decodes and exports in float32
    # The SavedModel's search on ids (the strings signature adds only the tokenizer around
    # the same search, and triples the export's tracing).
    assert cli.main(["export", "--run-dir", str(run_dir), "--output-dir",
                     str(tmp_path / "exported"), "--ids-only"]) == 0
    assert (tmp_path / "exported" / "run" / "1" / "saved_model.pb").is_file()
