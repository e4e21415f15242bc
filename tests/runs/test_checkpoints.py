"""Checkpoints (runs/checkpoints.py): Keras weight files with their JSON, the last K kept,
restore past a damaged one, averaging, a checkpoint of another model named, TensorFlow-format
checkpoints of keras-transformer 0.2.0 refused, and checkpoints moving between backends."""

import json
import logging
import os
import pathlib
import re
import shutil

import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer.errors import RunError
from keras_transformer.runs import Run
from keras_transformer.runs.checkpoints import average_checkpoints, list_checkpoints


def tiny_transformer(num_layers=1, compiled=True):
    """The smallest Transformer (vocab 50, d_model 16), compiled with Keras' Adam and its
    optimizer built, as training leaves it."""
    import keras

    from keras_transformer.models.transformer import Transformer

    model = Transformer(vocab_size=50, num_layers=num_layers, d_model=16, num_heads=2, d_ff=32)
    model.build()
    if compiled:
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
        model.optimizer.build(model.trainable_variables)
    return model


def set_distinct_values(model, seed, iterations):
    """Gives every weight and optimizer variable values of its own (so a restore is seen)."""
    rng = np.random.default_rng(seed)
    for variable in model.weights + model.optimizer.variables:
        if "int" in str(variable.dtype):
            variable.assign(np.full(variable.shape, iterations, "int64"))
        else:
            variable.assign(rng.normal(size=variable.shape).astype("float32"))


def all_values(model):
    import keras

    return [keras.ops.convert_to_numpy(v) for v in model.weights + model.optimizer.variables]


def test_a_checkpoint_is_a_keras_weights_file_and_a_json_the_last_k_are_kept(tmp_path):
    run = Run(tmp_path / "run")
    model = tiny_transformer()
    for step in (1, 2, 3, 4):
        set_distinct_values(model, step, step)
        path = run.save_checkpoint(model, step, data_position=2 * step, keep=2)
    assert path == str(run.checkpoint_dir / "ckpt-4.weights.h5")
    assert sorted(os.listdir(run.checkpoint_dir)) == [
        "ckpt-3.json", "ckpt-3.weights.h5", "ckpt-4.json", "ckpt-4.weights.h5"]
    info = json.loads((run.checkpoint_dir / "ckpt-4.json").read_text())
    assert (info["step"], info["data_position"], info["weights"]) == (4, 8, "ckpt-4.weights.h5")
    assert (info["backend"], len(info["sha256"])) == ("tensorflow", 64)
    assert [Run.data_position(p) for p in run.checkpoints()] == [6, 8]

    restored = tiny_transformer()
    assert run.restore(restored) == (path, 4, 8)
    for got, saved in zip(all_values(restored), all_values(model)):
        np.testing.assert_array_equal(got, saved)
    assert int(restored.optimizer.iterations.numpy()) == 4

    # A weights file whose JSON never came (a writer killed between the two) does not count,
    # and goes at the next save.
    orphan = run.checkpoint_dir / "ckpt-5.weights.h5"
    shutil.copy(path, orphan)
    assert run.checkpoints()[-1] == path
    run.save_checkpoint(model, 6, keep=2)
    assert not orphan.exists() and [Run.checkpoint_step(p) for p in run.checkpoints()] == [4, 6]
    assert Run.data_position(run.checkpoints()[-1]) is None


def damage(path, how):
    sidecar = pathlib.Path(str(path).replace(".weights.h5", ".json"))
    if how == "truncated":
        with open(path, "r+b") as handle:
            handle.truncate(os.path.getsize(path) // 2)
    elif how == "corrupt":  # bytes in the middle of the data: HDF5 alone would not notice
        with open(path, "r+b") as handle:
            handle.seek(os.path.getsize(path) // 2)
            handle.write(b"\xff" * 64)
    elif how == "empty":
        open(path, "wb").close()
    elif how == "bad json":
        sidecar.write_text('{"step": 2, "data_po')
    elif how == "json without its keys":
        sidecar.write_text("{}")


@pytest.mark.parametrize("how", ["truncated", "corrupt", "empty", "bad json",
                                 "json without its keys"])
def test_a_damaged_checkpoint_is_named_and_the_one_before_used(tmp_path, caplog, how):
    run = Run(tmp_path / "run")
    model = tiny_transformer()
    set_distinct_values(model, 1, 1)
    first = run.save_checkpoint(model, 1, data_position=3)
    expected = all_values(model)
    set_distinct_values(model, 2, 2)
    newest = run.save_checkpoint(model, 2, data_position=5)
    damage(newest, how)

    restored = tiny_transformer()
    with caplog.at_level(logging.WARNING):
        assert run.restore(restored) == (first, 1, 3)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and newest in warnings[0] and "damaged" in warnings[0], warnings
    for got, saved in zip(all_values(restored), expected):
        np.testing.assert_array_equal(got, saved)

    caplog.clear()
    plain = tiny_transformer(compiled=False)
    with caplog.at_level(logging.WARNING):
        assert average_checkpoints(plain, run.checkpoints(), skip_damaged=True) == [first]
    assert any(newest in r.getMessage() and "skipped" in r.getMessage() for r in caplog.records)
    with pytest.raises(RunError, match=re.escape(f"checkpoint {newest} is damaged")):
        average_checkpoints(plain, run.checkpoints())


def test_a_checkpoint_of_another_model_raises_run_error_naming_it(tmp_path):
    run = Run(tmp_path / "run")
    path = run.save_checkpoint(tiny_transformer(num_layers=1), 1)
    for other in (tiny_transformer(num_layers=2), tiny_transformer(num_layers=2, compiled=False)):
        with pytest.raises(RunError, match=re.escape(path) + ".*does not hold the weights"):
            average_checkpoints(other, [path], skip_damaged=True)
    with pytest.raises(RunError, match=re.escape(path) + ".*does not hold the weights"):
        run.restore(tiny_transformer(num_layers=2))
    # A bigger model's file into a smaller model (Keras alone would load it silently).
    bigger = Run(tmp_path / "bigger").save_checkpoint(tiny_transformer(num_layers=2), 1)
    with pytest.raises(RunError, match=re.escape(bigger) + ".*weights in the file"):
        average_checkpoints(tiny_transformer(num_layers=1), [bigger])
    # Weights without optimizer state average, but do not resume training.
    unresumable = Run(tmp_path / "plain").save_checkpoint(tiny_transformer(compiled=False), 1)
    average_checkpoints(tiny_transformer(), [unresumable])
    with pytest.raises(RunError, match="holds no optimizer state"):
        Run(tmp_path / "plain").restore(tiny_transformer())


def test_the_run_modules_import_no_tensorflow():
    import ast

    from keras_transformer.runs import checkpoints, choices, model_files, run as run_module

    for module in (run_module, checkpoints, choices, model_files):
        imported = set()
        for node in ast.walk(ast.parse(pathlib.Path(module.__file__).read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add((node.module or "").split(".")[0])
        assert "tensorflow" not in imported, module.__name__


def write_tensorflow_format_checkpoints(directory, steps=(600, 1200)):
    """Files named as keras-transformer 0.2.0 and earlier named its TensorFlow checkpoints
    (their contents are never read)."""
    directory.mkdir(parents=True, exist_ok=True)
    for step in steps:
        (directory / f"ckpt-{step}.index").write_bytes(b"old")
        (directory / f"ckpt-{step}.data-00000-of-00001").write_bytes(b"old")
    (directory / "checkpoint").write_text('model_checkpoint_path: "ckpt-1200"\n')


def assert_refused_in_one_line(error):
    message = str(error.value)
    assert len(message.splitlines()) == 1, message
    assert "holds TensorFlow-format checkpoints (ckpt-1200.index)" in message
    assert "keras-transformer 0.2.0 or earlier" in message and "convert" in message
    assert "train again" in message


def test_tensorflow_format_checkpoints_are_refused_with_one_line_saying_what_to_do(tmp_path):
    run = Run(tmp_path / "run")
    model = tiny_transformer()
    run.save_checkpoint(model, 5)  # Keras ones beside the old ones do not make it readable
    write_tensorflow_format_checkpoints(run.checkpoint_dir)
    for action in (run.checkpoints, lambda: run.restore(tiny_transformer()),
                   lambda: run.average(2, model=tiny_transformer(compiled=False)),
                   lambda: list_checkpoints(run.checkpoint_dir)):
        with pytest.raises(RunError) as error:
            action()
        assert_refused_in_one_line(error)
    assert (run.checkpoint_dir / "ckpt-1200.index").is_file()  # left as they were


def test_the_command_line_refuses_a_run_with_tensorflow_format_checkpoints(run_copy, capsys):
    for path in (run_copy / "checkpoints").iterdir():
        path.unlink()
    write_tensorflow_format_checkpoints(run_copy / "checkpoints")
    assert cli.main(["average", "--run-dir", str(run_copy), "--last", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds TensorFlow-format checkpoints (ckpt-1200.index)" in err[0]


JAX_SCRIPT = """
import json, os, sys
os.environ["KERAS_BACKEND"] = "jax"
import keras
import numpy as np
assert keras.backend.backend() == "jax"
sys.path.insert(0, os.getcwd())
from keras_transformer.errors import RunError
from keras_transformer.runs.checkpoints import average_checkpoints
from keras_transformer.runs.run import Run

{helpers}

from_tensorflow, from_jax, old = sys.argv[1:4]
report = {}
model = tiny_transformer()
report["restored"] = list(Run(from_tensorflow).restore(model))
expected = np.load(os.path.join(from_tensorflow, "values.npz"))
report["equal"] = all(np.array_equal(got, expected[f"arr_{i}"])
                      for i, got in enumerate(all_values(model)))
report["averaged"] = len(average_checkpoints(tiny_transformer(compiled=False),
                                             Run(from_tensorflow).checkpoints()))
set_distinct_values(model, 7, 7)
Run(from_jax).save_checkpoint(model, 7, data_position=14)
np.savez(os.path.join(from_jax, "values.npz"), *all_values(model))
for action in ("restore", "average"):
    try:
        if action == "restore":
            Run(old).restore(tiny_transformer())
        else:
            Run(old).average(1, model=tiny_transformer())
    except RunError as error:
        report[action + "_old"] = str(error)
print(json.dumps(report))
"""


@pytest.mark.slow
def test_checkpoints_move_between_tensorflow_and_jax(tmp_path):
    import inspect
    import subprocess
    import sys

    # TensorFlow (this process) saves a Keras checkpoint; an old run has TensorFlow-format ones.
    from_tensorflow, from_jax, old = (tmp_path / name for name in ("tf", "jax", "old"))
    model = tiny_transformer()
    set_distinct_values(model, 3, 3)
    Run(from_tensorflow).save_checkpoint(model, 3, data_position=6)
    np.savez(from_tensorflow / "values.npz", *all_values(model))
    write_tensorflow_format_checkpoints(Run(old).checkpoint_dir)

    script = tmp_path / "jax_side.py"
    script.write_text(JAX_SCRIPT.replace("{helpers}", "\n\n".join(
        inspect.getsource(f) for f in (tiny_transformer, set_distinct_values, all_values))))
    result = subprocess.run(
        [sys.executable, str(script), str(from_tensorflow), str(from_jax), str(old)],
        capture_output=True, text=True, cwd=pathlib.Path(__file__).resolve().parents[2],
        env={**os.environ, "KERAS_BACKEND": "jax"}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    # JAX restored what TensorFlow saved, weights and Adam state alike.
    assert report["restored"] == [str(from_tensorflow / "checkpoints" / "ckpt-3.weights.h5"),
                                  3, 6]
    assert report["equal"] and report["averaged"] == 1
    # TensorFlow-format checkpoints are refused under JAX too, saying what to do.
    for action in ("restore", "average"):
        assert "holds TensorFlow-format checkpoints (ckpt-1200.index)" in report[action + "_old"]
        assert "train again" in report[action + "_old"]

    # TensorFlow restores and averages what JAX saved.
    restored = tiny_transformer()
    assert Run(from_jax).restore(restored) == (
        str(from_jax / "checkpoints" / "ckpt-7.weights.h5"), 7, 14)
    expected = np.load(from_jax / "values.npz")
    for i, got in enumerate(all_values(restored)):
        np.testing.assert_array_equal(got, expected[f"arr_{i}"])
    assert int(restored.optimizer.iterations.numpy()) == 7
    assert json.loads((from_jax / "checkpoints" / "ckpt-7.json").read_text())["backend"] == "jax"
    plain = tiny_transformer(compiled=False)
    average_checkpoints(plain, Run(from_jax).checkpoints() + Run(from_tensorflow).checkpoints())
    saved = [np.load(directory / "values.npz") for directory in (from_jax, from_tensorflow)]
    for i, got in enumerate(plain.get_weights()):
        np.testing.assert_allclose(got, (saved[0][f"arr_{i}"] + saved[1][f"arr_{i}"]) / 2,
                                   rtol=1e-6, atol=1e-6)
