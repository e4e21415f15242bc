import json
import os
import re
import socket
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer
from keras_transformer.runs import Run
from keras_transformer.runs.config import make_config
from keras_transformer.runs.run import average_checkpoints, checkpoint_step, list_checkpoints
from keras_transformer.training import NanGuard, TrainingError, compile_model
from tests.training_helpers import kill_once_exists, run, train_command

# The trainings here are of one layer each side (the tiny preset's two, halved): what they
# check does not depend on the depth, and a step's graph (traced in each training) is about
# half as big.
ONE_LAYER = ("--num-layers", "1")


def test_invalid_config_keys_and_values_are_named(tmp_path):
    bad_key = tmp_path / "bad.yaml"
    bad_key.write_text("preset: tiny\nlearning_rat: 0.1\n")
    with pytest.raises(ValueError, match="unknown config key 'learning_rat'"):
        make_config(bad_key)
    bad_value = tmp_path / "bad.json"
    bad_value.write_text(json.dumps({"tokens_per_batch": -5}))
    with pytest.raises(ValueError, match="'tokens_per_batch' must be positive; got -5"):
        make_config(bad_value)
    with pytest.raises(ValueError, match="'precision' must be one of"):
        make_config(precision="float8")
    with pytest.raises(ValueError, match="'dropout' must be float or null; got 'high'"):
        make_config(dropout="high")
    with pytest.raises(ValueError, match="'preset' is not a preset"):
        make_config(preset="huge")
    good = tmp_path / "good.yaml"
    good.write_text("preset: tiny\ntrain_steps: 7\nxla: true\n")
    config = make_config(good, train_steps=9)
    assert (config.preset, config.train_steps, config.xla) == ("tiny", 9, True)


def test_cli_rejects_bad_config_with_exit_code_2(tmp_path, capsys):
    # In this process: the real command's exit status 2 is checked in child processes by
    # tests/test_translate.py, tests/test_ctranslate2.py and tests/test_preemption.py.
    from keras_transformer import cli

    bad = tmp_path / "bad.yaml"
    bad.write_text("warmup: 10\n")
    assert cli.main(["train", "--config", str(bad)]) == 2
    assert "unknown config key 'warmup'" in capsys.readouterr().err


def test_empty_text_files_are_refused_naming_them_before_anything_is_written(toy_corpus,
                                                                           tmp_path, capsys):
    from keras_transformer import cli

    empty_src, empty_tgt = tmp_path / "empty.src", tmp_path / "empty.tgt"
    empty_src.write_bytes(b"")
    empty_tgt.write_bytes(b"")
    blank = tmp_path / "blank.src"
    blank.write_text("\n  \n", encoding="utf-8")
    train, dev = (toy_corpus["train.src"], toy_corpus["train.tgt"]), (toy_corpus["dev.src"],
                                                                     toy_corpus["dev.tgt"])
    for (train_src, train_tgt), (dev_src, dev_tgt), message in (
            ((empty_src, empty_tgt), dev, f"{empty_src} and {empty_tgt} are empty"),
            (train, (empty_src, dev[1]), f"{empty_src} is empty"),
            (train, (blank, empty_tgt), f"{empty_tgt} is empty"),
            ((blank, blank), dev, f"each of the 2 lines of {blank} and {blank} has an empty "
             "side (such pairs are skipped)")):
        output_dir = tmp_path / "run"
        assert cli.main(["train", "--preset", "tiny", "--dataset", "text", "--train-src",
                         str(train_src), "--train-tgt", str(train_tgt), "--dev-src",
                         str(dev_src), "--dev-tgt", str(dev_tgt), "--vocab-size", "400",
                         "--output-dir", str(output_dir), "--verbose", "0"]) == 2
        err = capsys.readouterr().err
        assert (f"keras-transformer train: error: No sentence pairs to read: {message}. Give "
                "line-aligned files with at least one pair of non-empty lines") in err
        # Nothing of a run: the same command with the files corrected is a new run.
        assert not output_dir.exists() or {p.name for p in output_dir.iterdir()} <= {".lock"}


@pytest.mark.slow
def test_nan_loss_stops_training_with_a_clear_message():
    model = Transformer.from_preset("tiny", vocab_size=20)
    # Eagerly: the guard sees the same loss as in a traced step, without the tracing.
    model.compile(optimizer="sgd", loss=lambda y, p: tf.reduce_mean(p) * np.nan,
                  run_eagerly=True)
    x = (np.ones((4, 3), "int32"), np.ones((4, 3), "int32"))
    with pytest.raises(TrainingError, match="Loss became nan at step 1"):
        model.fit(x, np.ones((4, 3), "int32"), epochs=1, verbose=0,
                  callbacks=[NanGuard(lambda: int(model.optimizer.iterations))])


def test_averaging_two_checkpoints_gives_the_mean(tmp_path):
    model = Transformer.from_preset("tiny", vocab_size=30)
    model.build()
    first = model.get_weights()
    checkpoints = Run(tmp_path)
    path_a = checkpoints.save_checkpoint(model, 1)
    second = [w + np.random.default_rng(i).normal(size=w.shape).astype(w.dtype)
              for i, w in enumerate(first)]
    model.set_weights(second)
    path_b = checkpoints.save_checkpoint(model, 2)

    fresh = Transformer.from_preset("tiny", vocab_size=30)
    fresh.build()
    average_checkpoints(fresh, [path_a, path_b])
    for got, a, b in zip(fresh.get_weights(), first, second):
        np.testing.assert_allclose(got, (a + b) / 2, rtol=1e-6, atol=1e-7)


def build_model(config, vocab_size):
    model = Transformer(vocab_size=vocab_size, **config.architecture)
    model.build()
    return model


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["float32", "mixed_float16"])
def test_checkpoints_hold_every_weight_and_optimizer_variable(tmp_path, precision):
    # Under mixed_float16 the optimizer is a LossScaleOptimizer: its loss scale is saved too.
    config = make_config(preset="tiny", num_layers=1, precision=precision).resolved()
    keras.mixed_precision.set_global_policy(precision)
    try:
        model = build_model(config, 40)
        optimizer, _ = compile_model(model, config)
        model.run_eagerly = True  # the same variables and updates as a traced step, untraced
        ids = np.random.default_rng(0).integers(3, 40, (4, 6)).astype("int32")
        model.fit((ids, ids), ids, epochs=2, verbose=0)
        checkpoints = Run(tmp_path)
        path = checkpoints.save_checkpoint(model, 2, data_position=5)

        restored = build_model(config, 40)
        restored_optimizer, _ = compile_model(restored, config)
        assert checkpoints.restore(restored) == (path, 2, 5)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert len(restored_optimizer.variables) == len(optimizer.variables) > len(model.weights)
    for a, b in zip(model.weights, restored.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    for a, b in zip(optimizer.variables, restored_optimizer.variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)
    assert int(restored_optimizer.iterations) == 2


def latest_step(run_dir):
    paths = list_checkpoints(run_dir / "checkpoints")
    return checkpoint_step(paths[-1]) if paths else 0


@pytest.mark.slow
def test_killed_run_resumes_from_its_last_checkpoint(toy_corpus, tmp_path, capsys):
    from keras_transformer import cli

    run_dir = tmp_path / "run"
    # 12 steps, a checkpoint every 4 (the steps, not their number, are what is checked).
    command = train_command(toy_corpus, run_dir, "--train-steps", "12", "--checkpoint-steps",
                            "4", "--eval-steps", "12", *ONE_LAYER)
    # A child process, SIGKILLed as soon as its checkpoint of step 8 is complete (its JSON
    # is written last).
    error = kill_once_exists(command, run_dir / "checkpoints" / "ckpt-8.json")
    killed_at = latest_step(run_dir)
    assert 8 <= killed_at < 12, error[-2000:]

    # The same command again, in this process.
    capsys.readouterr()
    assert cli.main(command[3:]) == 0
    out = capsys.readouterr().out
    resumed = re.search(r"resumed from .*ckpt-(\d+)\.weights\.h5 at step (\d+)", out)
    assert resumed and int(resumed.group(1)) == int(resumed.group(2)) == killed_at
    assert f"training batch {killed_at}" in out  # the saved data position
    assert re.search(rf"training done: step {killed_at} -> 12 ", out)
    assert latest_step(run_dir) == 12


MIRRORED_SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    from keras_transformer import Transformer
    from keras_transformer.runs.config import make_config
    from keras_transformer.training.loss import LabelSmoothedCrossEntropy

    def build_model(config, vocab_size):
        model = Transformer(vocab_size=vocab_size, **config.architecture)
        model.build()
        return model

    # Plain SGD: Adam's first step is about lr * sign(gradient), which turns rounding noise on
    # parameters whose true gradient is zero (attention key biases) into full-size steps.
    def compile_sgd(model):
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LabelSmoothedCrossEntropy(0.1))

    config = make_config(preset="tiny", num_layers=1, dropout=0.0, warmup_steps=10).resolved()
    rng = np.random.default_rng(0)

    def batch(rows, src_len, tgt_len):
        src = rng.integers(3, 40, (rows, src_len)).astype("int32")
        tgt = rng.integers(3, 40, (rows, tgt_len + 1)).astype("int32")
        src[0, src_len // 2:] = 0
        tgt[1, 2:] = 0
        return src, tgt[:, :-1], tgt[:, 1:]

    halves = [batch(2, 5, 4), batch(2, 7, 9)]  # different shapes and token counts
    def pad(a, width):
        return np.pad(a, ((0, 0), (0, width - a.shape[1])))
    whole = [np.concatenate([pad(h[i], max(x[i].shape[1] for x in halves)) for h in halves])
             for i in range(3)]

    keras.utils.set_random_seed(1)
    single = build_model(config, 40)
    compile_sgd(single)
    initial = single.get_weights()
    history = single.fit((whole[0], whole[1]), whole[2], batch_size=4, epochs=1, verbose=0,
                         shuffle=False)

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        mirrored = build_model(config, 40)
        compile_sgd(mirrored)
    mirrored.set_weights(initial)

    def dataset_fn(context):
        first, second = ((tf.data.Dataset.from_tensors(((h[0], h[1]), h[2])) for h in halves))
        return first.concatenate(second)

    data = strategy.distribute_datasets_from_function(dataset_fn)
    mirrored_history = mirrored.fit(data, epochs=1, steps_per_epoch=1, verbose=0)
    diff = max(float(np.max(np.abs(a - b)))
               for a, b in zip(single.get_weights(), mirrored.get_weights()))
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(initial, single.get_weights()))
    print(json.dumps({"single_loss": history.history["loss"][0],
                      "mirrored_loss": mirrored_history.history["loss"][0],
                      "max_weight_diff": diff, "max_update": moved}))
""")


@pytest.mark.slow
def test_mirrored_strategy_matches_a_single_device(tmp_path):
    script = tmp_path / "mirrored.py"
    script.write_text(MIRRORED_SCRIPT)
    result = run([sys.executable, str(script)], cwd=os.getcwd())
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["max_update"] > 1e-3  # the step really changed the weights
    assert report["mirrored_loss"] == pytest.approx(report["single_loss"], abs=1e-4)
    assert report["max_weight_diff"] < 1e-4


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_multiworker_training_on_localhost_keeps_workers_identical(toy_corpus, tmp_path):
    run_dir = tmp_path / "run"
    workers = [f"localhost:{free_port()}" for _ in range(2)]
    command = train_command(toy_corpus, run_dir, "--strategy", "multiworker", "--train-steps", "6",
                            "--checkpoint-steps", "3", "--eval-steps", "3", "--shard-pairs", "100",
                            *ONE_LAYER)
    processes = []
    for index in range(2):
        env = dict(os.environ, TF_CONFIG=json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}))
        processes.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
    outputs = [p.communicate(timeout=600) for p in processes]
    for process, (out, err) in zip(processes, outputs):
        assert process.returncode == 0, err[-3000:]
    # File-level sharding: the workers read disjoint shards, all of them together.
    shards = [re.search(rf"input pipeline {i} of 2 reads shards ([\d,]+)", out).group(1)
              for i, (out, _) in enumerate(outputs)]
    shards = [set(map(int, s.split(","))) for s in shards]
    assert shards[0].isdisjoint(shards[1]) and shards[0] | shards[1] == {0, 1, 2, 3}
    # Only the chief's checkpoints are the run's; the other worker keeps its newest apart.
    assert sorted(os.listdir(run_dir / "scratch-worker-1")) == ["ckpt-6.json",
                                                                "ckpt-6.weights.h5"]
    chief = model_weights(run_dir / "checkpoints" / "ckpt-6.weights.h5")
    other = model_weights(run_dir / "scratch-worker-1" / "ckpt-6.weights.h5")
    assert len(chief) > 20 and chief.keys() == other.keys()
    for name in chief:
        np.testing.assert_array_equal(chief[name], other[name], err_msg=name)
    first = model_weights(run_dir / "checkpoints" / "ckpt-3.weights.h5")
    assert any(not np.array_equal(first[n], chief[n]) for n in chief)


def model_weights(path):
    """{name: array} of the model weights (not the optimizer's) in a Keras weights file."""
    import h5py

    weights = {}
    with h5py.File(path, "r") as handle:
        handle.visititems(lambda name, item: weights.__setitem__(name, item[()]) if isinstance(
            item, h5py.Dataset) and not name.startswith("optimizer/") else None)
    return weights


# Two runs in this process (`train` restores the process's dtype policy): gradient
# accumulation and dev BLEU ride on the mixed_bfloat16 run (float32 accumulation is
# tests/test_preemption.py's).
@pytest.mark.slow
@pytest.mark.parametrize("options", [["--precision", "mixed_bfloat16", "--grad-accum-steps",
                                      "2", "--bleu-steps", "3", "--bleu-sentences", "10"],
                                     ["--precision", "mixed_float16"]])
def test_training_options_reach_the_requested_steps(toy_corpus, tmp_path, capsys, options):
    from keras_transformer import cli

    command = train_command(toy_corpus, tmp_path / "run", "--train-steps", "6", "--eval-steps",
                            "3", *ONE_LAYER, *options)
    assert cli.main(command[3:]) == 0
    assert keras.mixed_precision.global_policy().name == "float32"
    out = capsys.readouterr().out
    assert re.search(r"training done: step 0 -> 6 .*reached train_steps=6", out)
    assert "pairs longer than max_length=32 are dropped" in out
    if "--bleu-steps" in options:
        assert re.search(r"step 6: dev BLEU \(greedy, 10 sentences\) \d+\.\d\d", out)
