"""The package's face has no side effects, and the command line builds without heavy imports."""

import json
import subprocess
import sys

import pytest

# Runs in a fresh interpreter: prints what the import changed.
IMPORT_PACKAGE = """
import json, os, sys
environ, meta_path = dict(os.environ), list(sys.meta_path)
fd2 = os.fstat(2)
import keras_transformer
after = os.fstat(2)
print(json.dumps({
    "environ": {k: v for k, v in os.environ.items() if environ.get(k) != v},
    "removed": sorted(set(environ) - set(os.environ)),
    "meta_path": [repr(f) for f in sys.meta_path if f not in meta_path],
    "fd2": [fd2.st_dev, fd2.st_ino] == [after.st_dev, after.st_ino],
    "stderr": sys.stderr is sys.__stderr__,
    "modules": sorted(m for m in sys.modules if m.startswith(("keras", "tensorflow", "jax"))
                      and m != "keras_transformer"),
}))
"""

IMPORT_LAYERS = """
import json, sys
import keras_transformer.layers
print(json.dumps(sorted(m for m in sys.modules if m.startswith(
    ("keras_transformer.training", "keras_transformer.export", "pipelines")))))
"""


def _python(code, **environ):
    import os

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, **environ})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_importing_the_package_changes_nothing():
    # Without the variables the old package set, so that a setdefault would show.
    environ = {k: v for k, v in __import__("os").environ.items()
               if k not in ("KERAS_BACKEND", "TF_CPP_MIN_LOG_LEVEL")}
    result = subprocess.run([sys.executable, "-c", IMPORT_PACKAGE], capture_output=True,
                            text=True, env=environ)
    assert result.returncode == 0, result.stderr[-3000:]
    changes = json.loads(result.stdout.strip().splitlines()[-1])
    assert changes["environ"] == {} and changes["removed"] == []
    assert changes["meta_path"] == []
    assert changes["fd2"] and changes["stderr"]
    assert changes["modules"] == []  # no framework, no submodule


def test_the_layers_import_no_training_export_or_pipeline_module():
    assert _python(IMPORT_LAYERS) == []


def test_the_package_names_its_public_api_lazily():
    import keras_transformer
    from keras_transformer.models import PRESETS, Transformer
    from keras_transformer.training.loss import LabelSmoothedCrossEntropy

    assert keras_transformer.Transformer is Transformer
    assert keras_transformer.PRESETS is PRESETS
    assert keras_transformer.LabelSmoothedCrossEntropy is LabelSmoothedCrossEntropy
    assert keras_transformer.__version__
    assert set(keras_transformer.__all__) <= set(dir(keras_transformer))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        keras_transformer.nothing  # noqa: B018


def test_a_saved_model_loads_in_a_fresh_interpreter(tmp_path):
    """Loading a .keras model needs the layers registered: Run.load_model (what translate,
    evaluate and export use) imports what registration requires."""
    from keras_transformer.models import Transformer
    from keras_transformer.runs.run import save_keras

    model = Transformer(vocab_size=40, num_layers=1, d_model=8, num_heads=2, d_ff=16)
    model.build()
    path = save_keras(model, tmp_path / "model.keras")
    code = (f"import json; from keras_transformer.runs import Run\n"
            f"model = Run({str(tmp_path)!r}).load_model(path={str(path)!r})\n"
            "print(json.dumps(type(model).__name__))")
    assert _python(code) == "Transformer"


def test_the_command_line_builds_without_heavy_imports():
    # (cli.train is left out while runs.config imports keras_transformer.models, whose
    # __init__ imports Keras.)
    code = """
import argparse, json, sys
from keras_transformer.cli import decode, demo, export, models
commands = argparse.ArgumentParser().add_subparsers()
for family in (models, export, decode, demo):
    family.register(commands)
for parser in commands.choices.values():
    parser.format_help()
print(json.dumps(sorted(m for m in sys.modules
                        if m.split(".")[0] in ("tensorflow", "keras", "jax", "torch"))))
"""
    assert _python(code) == []
