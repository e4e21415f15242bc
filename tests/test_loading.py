"""A saved model loads the Keras way: `import keras, keras_transformer`, then
`keras.models.load_model(path)`, in a fresh interpreter, on TensorFlow and on JAX.

The files are a tiny run's: model.keras (written by `train`, compiled with FusedAdam, the
schedule and the loss), averaged.keras (written by `average`, not compiled), a model built
from a checkpoint and compiled with the metrics as well, and an ensemble of two models."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest


# What a user types, in a fresh interpreter: each file loaded compiled (the default) and not,
# with safe_mode=True; prints what loaded and the logits of one fixed batch.
LOAD = """
import json, sys
import keras, keras_transformer
import numpy as np

inputs = (np.array([[5, 6, 7, 8, 2]], "int32"), np.array([[1, 5, 6, 7]], "int32"))
batch = (inputs, np.array([[5, 6, 7, 2]], "int32"))
found = {}
for path in sys.argv[1:]:
    for compile in (True, False):
        model = keras.models.load_model(path, compile=compile, safe_mode=True)
        compiled = getattr(model, "compiled", False) and model.optimizer is not None
        found[f"{path}:{compile}"] = {
            "class": type(model).__name__,
            "optimizer": type(model.optimizer).__name__ if compiled else None,
            "schedule": type(model.optimizer._learning_rate).__name__ if compiled else None,
            "loss": type(model.loss).__name__ if compiled else None,
            # what evaluating one batch reports (the compiled loss and metrics at work)
            "evaluated": sorted(model.evaluate(*batch, verbose=0, return_dict=True))
                         if compiled else [],
            "logits": keras.ops.convert_to_numpy(model(inputs)).astype("float64").tolist(),
        }
print(json.dumps({"backend": keras.backend.backend(), "found": found}))
"""


@pytest.fixture(scope="module")
def saved_files(tiny_run, tmp_path_factory):
    """The four .keras files and the logits each gives in this process."""
    import keras

    from keras_transformer.models import Ensemble
    from keras_transformer.runs import Run
    from keras_transformer.training.loss import LabelSmoothedCrossEntropy
    from keras_transformer.training.metrics import Perplexity, TokenAccuracy
    from keras_transformer.training.optimizer import paper_optimizer

    folder = tmp_path_factory.mktemp("saved")
    run = Run(tiny_run)
    averaged, _ = run.average(last_k=2)
    averaged_path = run.save_model(averaged, path=folder / "averaged.keras")

    restored = run.build_model()
    config = run.config
    restored.compile(optimizer=paper_optimizer(restored.d_model, config.warmup_steps),
                     loss=LabelSmoothedCrossEntropy(config.label_smoothing),
                     metrics=[TokenAccuracy(), Perplexity()])
    restored.optimizer.build(restored.trainable_variables)
    assert run.restore(restored).step == 20
    restored_path = run.save_model(restored, path=folder / "restored.keras")

    trained = keras.models.load_model(run.model_path, compile=False)
    ensemble_path = run.save_model(Ensemble([trained, averaged]), path=folder / "ensemble.keras")

    inputs = (np.array([[5, 6, 7, 8, 2]], "int32"), np.array([[1, 5, 6, 7]], "int32"))
    logits = {str(path): keras.ops.convert_to_numpy(model(inputs))
              for path, model in [(run.model_path, trained), (averaged_path, averaged),
                                  (restored_path, restored),
                                  (ensemble_path, Ensemble([trained, averaged]))]}
    return logits


def _load_in_fresh_interpreter(paths, backend):
    environ = {**os.environ, "KERAS_BACKEND": backend}
    result = subprocess.run([sys.executable, "-c", LOAD, *paths], capture_output=True,
                            text=True, env=environ, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _check(saved_files, backend):
    loaded = _load_in_fresh_interpreter(list(saved_files), backend)
    assert loaded["backend"] == backend
    found = loaded["found"]
    for path, logits in saved_files.items():
        name = os.path.basename(path)
        for compile in (True, False):
            model = found[f"{path}:{compile}"]
            assert model["class"] == ("Ensemble" if name == "ensemble.keras" else "Transformer")
            np.testing.assert_allclose(model["logits"], logits, atol=2e-4, err_msg=name)
            if not compile or name in ("averaged.keras", "ensemble.keras"):
                assert model["optimizer"] is None, (name, compile)  # saved without compiling
            else:  # train's model and the checkpoint-built one keep their compile config
                assert model["optimizer"] == "FusedAdam", (name, model)
                assert model["schedule"] == "TransformerSchedule"
                assert model["loss"] == "LabelSmoothedCrossEntropy"
        if name == "restored.keras":
            assert found[f"{path}:True"]["evaluated"] == ["loss", "perplexity", "token_accuracy"]


@pytest.mark.slow
def test_saved_models_load_the_keras_way_on_tensorflow(saved_files):
    _check(saved_files, "tensorflow")


@pytest.mark.slow
def test_saved_models_load_the_keras_way_on_jax(saved_files):
    pytest.importorskip("jax")
    _check(saved_files, "jax")
