"""The run directory: self-contained configs, resume after a move, a preset change or a damaged
checkpoint, the vocabulary cache, atomic files, and the command line's error rule."""

import json
import logging
import os
import pathlib
import re
import shutil

import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer.errors import ConfigError, RunError
from keras_transformer.models import presets
from keras_transformer.runs import Run
from keras_transformer.runs.run import (FORMAT_VERSION, TEMPORARY_PREFIX, atomic_path,
                                        average_checkpoints, remove_stale_temporaries,
                                        restore_checkpoint, training_checkpoint, write_text)
from keras_transformer.training import train
from tests.conftest import RUNTIME_PRESET, toy_config

def test_config_json_is_self_contained(tiny_run):
    saved = json.loads((tiny_run / "config.json").read_text())
    assert saved["format_version"] == FORMAT_VERSION
    assert saved["architecture"] == {**saved["architecture"], "num_layers": 2, "d_model": 32,
                                     "num_heads": 4, "d_ff": 64, "key_dim": 8, "value_dim": 8}
    assert (saved["train_steps"], saved["warmup_steps"], saved["label_smoothing"]) == (20, 50, 0.1)
    run = Run(tiny_run)
    assert run.config.architecture == saved["architecture"]
    assert [os.path.basename(p) for p in run.checkpoints()] == [
        "ckpt-10.weights.h5", "ckpt-20.weights.h5"]
    assert [Run.checkpoint_step(p) for p in run.checkpoints()] == [10, 20]


@pytest.mark.slow
def test_a_changed_preset_does_not_change_the_run(run_copy, toy_corpus, runtime_preset, capsys):
    presets.PRESETS[RUNTIME_PRESET]["model"].update(d_model=48, num_heads=2)
    try:
        # evaluate
        assert cli.main(["evaluate", "--run-dir", str(run_copy), "--src",
                         str(toy_corpus["dev.src"]), "--ref", str(toy_corpus["dev.tgt"]), "--beam",
                         "2"]) == 0
        assert '"sacrebleu"' in capsys.readouterr().out
        # average
        assert cli.main(["average", "--run-dir", str(run_copy), "--last", "2"]) == 0
        averaged = Run(run_copy).load_model()
        assert averaged.d_model == 32
        # resume: the saved architecture wins over today's preset
        summary = train(toy_config(toy_corpus, run_copy, train_steps=25))
        assert (summary["start_step"], summary["step"]) == (20, 25)
        assert Run(run_copy).load_model(prefer_averaged=False).d_model == 32
    finally:
        presets.PRESETS[RUNTIME_PRESET]["model"].update(d_model=32, num_heads=4)


@pytest.mark.slow
def test_a_moved_run_directory_resumes(run_copy, toy_corpus, tmp_path, capsys):
    moved = tmp_path / "elsewhere" / "renamed"
    moved.parent.mkdir()
    shutil.move(run_copy, moved)
    summary = train(toy_config(toy_corpus, moved, train_steps=25))
    out = capsys.readouterr().out
    assert re.search(r"resumed from .*renamed/checkpoints/ckpt-20\.weights\.h5 at step 20",
                     out), out
    assert (summary["start_step"], summary["step"]) == (20, 25)
    assert Run(moved).config.output_dir == str(moved)


def test_resume_refuses_a_different_architecture_by_name(run_copy, toy_corpus):
    with pytest.raises(ConfigError, match=r"d_model: 32 -> 64.*train_steps"):
        train(toy_config(toy_corpus, run_copy, d_model=64))
    with pytest.raises(ConfigError, match=r"vocab_size: 400 -> 500"):
        train(toy_config(toy_corpus, run_copy, vocab_size=500))
    # Keys equal to the saved architecture, and the resumable keys, may be given.
    config = Run(run_copy).config_for(toy_config(toy_corpus, run_copy, d_model=32, num_layers=2,
                                                 train_steps=40, eval_steps=7))
    assert (config.train_steps, config.eval_steps, config.architecture["d_model"]) == (40, 7, 32)


def truncate_newest_checkpoint(run_dir):
    path = run_dir / "checkpoints" / "ckpt-20.weights.h5"
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)
    return path


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_is_named_and_the_one_before_is_used(
        run_copy, toy_corpus, caplog, capsys):
    truncate_newest_checkpoint(run_copy)
    with caplog.at_level(logging.WARNING):
        assert cli.main(["average", "--run-dir", str(run_copy), "--last", "2"]) == 0
    damaged = [r for r in caplog.records if "ckpt-20" in r.getMessage()]
    assert len(damaged) == 1 and "damaged" in damaged[0].getMessage()
    assert "averaged 1 checkpoints (ckpt-10.weights.h5)" in capsys.readouterr().out

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        summary = train(toy_config(toy_corpus, run_copy, train_steps=30))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
                and "damaged" in r.getMessage()]
    assert len(warnings) == 1 and "ckpt-20" in warnings[0], warnings
    assert re.search(r"resumed from .*ckpt-10\.weights\.h5 at step 10", capsys.readouterr().out)
    assert (summary["start_step"], summary["step"]) == (10, 30)
    assert os.path.basename(Run(run_copy).checkpoints()[-1]) == "ckpt-30.weights.h5"


def test_a_format_1_run_still_loads(run_copy):
    path = run_copy / "config.json"
    values = json.loads(path.read_text())
    del values["format_version"], values["architecture"]
    path.write_text(json.dumps(values))
    run = Run(run_copy)
    assert run.config.architecture["d_model"] == 32  # from today's preset, all it recorded
    assert run.load_model().d_model == 32
    assert run.build_model().count_params() == run.load_model().count_params()


def test_not_a_run_and_damaged_files_are_named(tmp_path, run_copy):
    with pytest.raises(RunError, match="not a training run directory"):
        Run(tmp_path).config
    (run_copy / "config.json").write_text("{not json")
    with pytest.raises(RunError, match="config.json is damaged"):
        Run(run_copy).config


def test_a_run_keeps_its_vocabulary(run_copy, tmp_path):
    run = Run(run_copy)
    own = run.tokenizer_path.read_bytes()
    same = tmp_path / "same.model"
    same.write_bytes(own)
    assert run.use_vocabulary(same).vocab_size == run.tokenizer().vocab_size
    other = tmp_path / "other.model"
    other.write_bytes(own + b"x")
    with pytest.raises(RunError, match="differs from the vocabulary of the prepared data"):
        run.use_vocabulary(other)
    assert run.tokenizer_path.read_bytes() == own


def test_atomic_writes_keep_the_old_file_on_failure_and_clean_up(tmp_path):
    target = tmp_path / "out" / "file.txt"
    write_text(target, "old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as temporary:
            temporary.write_text("half")
            raise RuntimeError("killed")
    assert target.read_text() == "old"
    assert os.listdir(target.parent) == ["file.txt"]
    folder = tmp_path / "version"
    for content in ("first", "second"):
        with atomic_path(folder) as temporary:
            temporary.mkdir()
            (temporary / "data").write_text(content)
    assert (folder / "data").read_text() == "second"
    # What a killed writer left (its process is gone) goes; a live writer's stays.
    dead = tmp_path / f"{TEMPORARY_PREFIX}999999999-file.txt"
    live = tmp_path / f"{TEMPORARY_PREFIX}{os.getpid()}-other.txt"
    dead.write_text("x")
    live.write_text("x")
    remove_stale_temporaries(tmp_path)
    assert not dead.exists() and live.exists()


def test_cli_exit_status_user_errors_2_internal_errors_1(tmp_path, monkeypatch, capsys):
    assert cli.main(["translate", "--run-dir", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

    def broken(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(cli, "_presets", broken)
    assert cli.main(["presets"]) == 1
    assert "internal error: ZeroDivisionError: a bug (run again with --debug" in \
        capsys.readouterr().err
    with pytest.raises(ZeroDivisionError):
        cli.main(["presets", "--debug"])
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "exit status: 0 done; 2 a user error" in capsys.readouterr().out


@pytest.mark.slow
def test_a_resumed_run_trains_on_exactly_the_batches_of_an_uninterrupted_one(
        toy_corpus, runtime_preset, tmp_path):
    # Without dropout, training is a function of the batches: stopping at the step-6
    # checkpoint and resuming must end with the weights of a run that never stopped. Small
    # shards (several groups and epochs in 12 steps) and gradient accumulation make the data
    # position more than the step.
    settings = dict(dropout=0.0, shard_pairs=60, grad_accum_steps=2, tokens_per_batch=128,
                    train_steps=12, checkpoint_steps=6, eval_steps=12)
    train(toy_config(toy_corpus, tmp_path / "whole", **settings))
    train(toy_config(toy_corpus, tmp_path / "pieces", **{**settings, "train_steps": 6}))
    summary = train(toy_config(toy_corpus, tmp_path / "pieces", **settings))
    assert summary["start_step"] == 6
    pieces = Run(tmp_path / "pieces")
    assert [Run.data_position(p) for p in pieces.checkpoints()] == [12, 24]  # 2 per step
    whole = Run(tmp_path / "whole").load_model().get_weights()
    for a, b in zip(whole, pieces.load_model().get_weights()):
        np.testing.assert_array_equal(a, b)


# -- checkpoints: Keras weight files, damage, old TensorFlow checkpoints, other backends --------


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


def test_run_py_imports_tensorflow_only_inside_functions():
    import ast

    from keras_transformer.runs import run as run_module

    imported = set()
    for node in ast.parse(pathlib.Path(run_module.__file__).read_text()).body:
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert "tensorflow" not in imported and "numpy" in imported


def write_tensorflow_checkpoints(run):
    """Rewrites `run`'s checkpoints as keras-transformer saved them before the Keras format:
    tf.train checkpoints with the data position, kept by a CheckpointManager. Returns
    {step: data position}."""
    import tensorflow as tf

    from keras_transformer.training import compile_model

    model = run.build_model()
    compile_model(model, run.config)
    position = tf.Variable(0, dtype=tf.int64, trainable=False)
    inner = training_checkpoint(model, model.optimizer)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=inner.model, optimizer=inner.optimizer,
                            data_position=position),
        str(run.checkpoint_dir), max_to_keep=5)
    positions = {}
    for path in run.checkpoints():
        restored = restore_checkpoint(model, path)
        position.assign(restored.data_position)
        positions[restored.step] = restored.data_position
        os.remove(path)
        os.remove(path.replace(".weights.h5", ".json"))
        manager.save(checkpoint_number=restored.step)
    return positions


@pytest.mark.slow
def test_a_run_with_tensorflow_checkpoints_resumes_averages_and_converts(
        run_copy, toy_corpus, capsys):
    run = Run(run_copy)
    keras_average, _ = run.average(2)
    positions = write_tensorflow_checkpoints(run)
    assert [os.path.basename(p) for p in run.checkpoints()] == ["ckpt-10", "ckpt-20"]
    assert [Run.data_position(p) for p in run.checkpoints()] == [positions[10], positions[20]]
    old_average, used = run.average(2)
    assert [os.path.basename(p) for p in used] == ["ckpt-10", "ckpt-20"]
    for a, b in zip(old_average.get_weights(), keras_average.get_weights()):
        np.testing.assert_array_equal(a, b)

    summary = train(toy_config(toy_corpus, run_copy, train_steps=25))
    out = capsys.readouterr().out
    assert re.search(rf"resumed from .*checkpoints/ckpt-20 at step 20, training batch "
                     rf"{positions[20]}\b", out), out
    assert (summary["start_step"], summary["step"]) == (20, 25)
    assert [os.path.basename(p) for p in run.checkpoints()] == [
        "ckpt-10", "ckpt-20", "ckpt-25.weights.h5"]
    assert len(run.average(3)[1]) == 3

    from keras_transformer.training import compile_model

    model = run.build_model()
    compile_model(model, run.config)
    assert len(run.convert_checkpoints(model)) == 2
    assert sorted(os.listdir(run.checkpoint_dir)) == sorted(
        f"ckpt-{step}.{kind}" for step in (10, 20, 25) for kind in ("json", "weights.h5"))
    assert [Run.data_position(p) for p in run.checkpoints()][:2] == [positions[10],
                                                                      positions[20]]
    assert len(run.average(3)[1]) == 3
    assert run.restore(model).step == 25


JAX_SCRIPT = """
import json, os, sys
os.environ["KERAS_BACKEND"] = "jax"
import keras
import numpy as np
assert keras.backend.backend() == "jax"
sys.path.insert(0, os.getcwd())
from keras_transformer.errors import RunError
from keras_transformer.runs.run import Run, average_checkpoints

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
            average_checkpoints(tiny_transformer(), Run(old).checkpoints())
    except RunError as error:
        report[action + "_old"] = str(error)
print(json.dumps(report))
"""


@pytest.mark.slow
def test_checkpoints_move_between_tensorflow_and_jax(tmp_path):
    import inspect
    import subprocess
    import sys

    # TensorFlow (this process) saves a Keras checkpoint and an old TensorFlow one.
    from_tensorflow, from_jax, old = (tmp_path / name for name in ("tf", "jax", "old"))
    model = tiny_transformer()
    set_distinct_values(model, 3, 3)
    Run(from_tensorflow).save_checkpoint(model, 3, data_position=6)
    np.savez(from_tensorflow / "values.npz", *all_values(model))
    old_checkpoints = Run(old).checkpoint_dir
    old_checkpoints.mkdir(parents=True)
    training_checkpoint(model, model.optimizer).write(str(old_checkpoints / "ckpt-3"))
    assert Run(old).checkpoints() == [str(old_checkpoints / "ckpt-3")]

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
    # An old TensorFlow checkpoint is refused under JAX, saying what to do.
    for action in ("restore", "average"):
        assert "ckpt-3 is a TensorFlow checkpoint" in report[action + "_old"]
        assert "under TensorFlow first" in report[action + "_old"]

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
