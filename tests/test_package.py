"""The package's face has no side effects, and the command line builds without heavy imports."""

import json
import subprocess
import sys

import pytest

# Runs in a fresh interpreter: prints what importing MODULE changed beyond what importing Keras
# (and its backend) does by itself (TensorFlow sets a few variables and an absl import
# detector of its own), and which of our modules it loaded.
IMPORT = """
import json, os, sys
import keras
environ, meta_path, hooks = dict(os.environ), list(sys.meta_path), list(sys.path_hooks)
fd2 = os.fstat(2)
import MODULE
after = os.fstat(2)
print(json.dumps({
    "environ": {k: v for k, v in os.environ.items() if environ.get(k) != v},
    "removed": sorted(set(environ) - set(os.environ)),
    "meta_path": [repr(f) for f in sys.meta_path if f not in meta_path],
    "path_hooks": [repr(f) for f in sys.path_hooks if f not in hooks],
    "fd2": [fd2.st_dev, fd2.st_ino] == [after.st_dev, after.st_ino],
    "stderr": sys.stderr is sys.__stderr__,
    "registered": sorted(name for name in keras.saving.get_custom_objects()
                         if name.startswith("keras_transformer>")),
    "modules": sorted(m for m in sys.modules if m.startswith(("keras_transformer", "pipelines",
                                                               "tensorflow"))),
}))
"""

# What importing the package may load: the registering modules and what they import.
NOT_LOADED = ("keras_transformer.training.trainer", "keras_transformer.training.callbacks",
              "keras_transformer.training.inputs", "keras_transformer.training.strategy",
              "keras_transformer.training.preemption", "keras_transformer.training.tensorboard",
              "keras_transformer.export", "keras_transformer.runs", "keras_transformer.cli",
              "keras_transformer.decoding", "keras_transformer.tasks")
PIPELINE_CONSTANTS = {"pipelines", "pipelines.special_ids"}  # the padding id: five constants

# Every class a saved model, a compiled model or a run names.
SAVEABLE = {"AveragingAdam", "Decoder", "DecoderLayer", "Encoder", "EncoderLayer", "Ensemble",
            "FusedAdam", "LabelSmoothedCrossEntropy", "LearnedPositionalEmbedding",
            "MultiHeadAttention", "Perplexity", "PositionwiseFeedForward", "ResidualConnection",
            "ScaledDotProductAttention", "ScaledEmbedding", "SinusoidalPositionalEncoding",
            "TokenAccuracy", "Transformer", "TransformerSchedule", "WarmupCosineDecay",
            "WarmupLinearDecay", "WarmupStableDecay"}


def _import_changes(module, backend="tensorflow"):
    # Without the variables the old package set, so that a setdefault would show.
    environ = {k: v for k, v in __import__("os").environ.items()
               if k not in ("KERAS_BACKEND", "TF_CPP_MIN_LOG_LEVEL")}
    result = subprocess.run([sys.executable, "-c", IMPORT.replace("MODULE", module)],
                            capture_output=True, text=True,
                            env={**environ, "KERAS_BACKEND": backend})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def _assert_no_side_effects(changes):
    assert changes["environ"] == {} and changes["removed"] == []
    assert changes["meta_path"] == [] and changes["path_hooks"] == []
    assert changes["fd2"] and changes["stderr"]
    heavy = [m for m in changes["modules"]
             if m.startswith(NOT_LOADED) or (m.startswith("pipelines")
                                              and m not in PIPELINE_CONSTANTS)]
    assert heavy == []  # no trainer, export, run, data or command module


def _python(code, **environ):
    import os

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, **environ})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # a fresh interpreter importing TensorFlow (about 7 CPU-s)
def test_importing_the_package_registers_every_saveable_class_and_changes_nothing():
    # `import keras_transformer.layers` runs the package's __init__ first: one interpreter
    # checks both imports.
    changes = _import_changes("keras_transformer; import keras_transformer.layers")
    _assert_no_side_effects(changes)
    assert {name.split(">")[1] for name in changes["registered"]} == SAVEABLE


@pytest.mark.slow  # a fresh interpreter importing Keras on JAX
def test_on_jax_the_package_imports_no_tensorflow():
    pytest.importorskip("jax")
    changes = _import_changes("keras_transformer; import keras_transformer.layers",
                              backend="jax")
    _assert_no_side_effects(changes)
    assert {name.split(">")[1] for name in changes["registered"]} == SAVEABLE
    assert [m for m in changes["modules"] if m.startswith("tensorflow")] == []


def test_the_package_names_its_public_api_lazily():
    import keras_transformer
    from keras_transformer.models import PRESETS, Transformer
    from keras_transformer.training.loss import LabelSmoothedCrossEntropy

    assert keras_transformer.Transformer is Transformer
    assert keras_transformer.PRESETS is PRESETS
    assert keras_transformer.LabelSmoothedCrossEntropy is LabelSmoothedCrossEntropy
    assert keras_transformer.FusedAdam.__name__ == "FusedAdam"
    assert keras_transformer.Ensemble.__name__ == "Ensemble"
    assert keras_transformer.__version__
    assert set(keras_transformer.__all__) <= set(dir(keras_transformer))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        keras_transformer.nothing  # noqa: B018


@pytest.mark.slow  # a fresh interpreter importing TensorFlow (about 7 CPU-s)
def test_a_saved_model_loads_in_a_fresh_interpreter(tmp_path):
    """Loading a .keras model needs the layers registered: Run.load_model (what translate,
    evaluate and export use) imports what registration requires."""
    from keras_transformer.models import Transformer
    from keras_transformer.runs.model_files import save_keras

    model = Transformer(vocab_size=40, num_layers=1, d_model=8, num_heads=2, d_ff=16)
    model.build()
    path = save_keras(model, tmp_path / "model.keras")
    code = (f"import json; from keras_transformer.runs import Run\n"
            f"model = Run({str(tmp_path)!r}).load_model(path={str(path)!r})\n"
            "print(json.dumps(type(model).__name__))")
    assert _python(code) == "Transformer"


def test_the_command_line_builds_without_heavy_imports():
    # The command as it is installed (keras_transformer_command.main): `--help` exits while
    # parsing, before the console is set up and the package registers its classes with Keras.
    code = """
import atexit, json, sys
atexit.register(lambda: print(json.dumps(sorted(
    m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "jax", "torch")))))
sys.argv = ["keras-transformer", "--help"]
import keras_transformer_command
keras_transformer_command.main()
"""
    assert _python(code) == []


@pytest.mark.slow
def test_the_command_registers_the_classes_once_its_console_is_set_up():
    # `params` runs after the console is set up: by then the package has registered.
    code = """
import atexit, json, os, sys
atexit.register(lambda: print(json.dumps([os.environ.get("TF_CPP_MIN_LOG_LEVEL"), sorted(
    n for n in __import__("keras").saving.get_custom_objects() if n.startswith("keras_t")),
    [name in sys.modules for name in ("tensorflow", "jax", "matplotlib")]])))
sys.argv = ["keras-transformer", "params", "--preset", "base", "--vocab-size", "100"]
import keras_transformer_command
keras_transformer_command.main()
"""
    environ = {k: v for k, v in __import__("os").environ.items()
               if k not in ("KERAS_BACKEND", "TF_CPP_MIN_LOG_LEVEL")}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=environ)
    assert result.returncode == 0, result.stderr[-3000:]
    level, registered, loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert level == "2"  # the command's default, set before TensorFlow loaded (it sets 1)
    assert {name.split(">")[1] for name in registered} == SAVEABLE
    # TensorFlow loaded without its optional imports of JAX and matplotlib (cli/lean_start.py;
    # the `dev` extra installs both).
    assert loaded == [True, False, False]
