"""The JAX path: a run trained under JAX with TensorFlow unimportable, then averaged, evaluated
and exported under TensorFlow, and resumed under JAX at its saved data position; the
TensorFlow-only commands refused by name under JAX."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.training_helpers import train_command

pytest.importorskip("jax")

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Runs the keras-transformer command with KERAS_BACKEND=jax where importing TensorFlow,
# tensorflow-text or tensorflow-datasets fails (as on a GPU machine without them).
NO_TENSORFLOW = """
import sys
for name in ("tensorflow", "tensorflow_text", "tensorflow_datasets"):
    sys.modules[name] = None
from keras_transformer.cli import main
code = main(sys.argv[1:])
assert not any(sys.modules.get(n) for n in ("tensorflow", "tensorflow_text",
                                            "tensorflow_datasets"))
sys.exit(code)
"""


def jax_command(*arguments, cwd=ROOT):
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-c", NO_TENSORFLOW, *arguments], capture_output=True,
                          text=True, timeout=600, env=env, cwd=cwd)


@pytest.fixture(scope="module")
def prepared(toy_corpus):
    """The toy corpus prepared under TensorFlow, in this process (the folder `prepare`
    prints)."""
    import contextlib
    import io

    from keras_transformer import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(["prepare", "--dataset", "text", "--train-src",
                         str(toy_corpus["train.src"]), "--train-tgt",
                         str(toy_corpus["train.tgt"]), "--vocab-size", "400", "--max-length",
                         "32", "--verbose", "0"])
    assert code == 0, out.getvalue()
    return out.getvalue().strip().splitlines()[-1]


def jax_train(corpus, prepared, output_dir, steps):
    # train_command's first three items start the TensorFlow CLI; keep its flags only.
    flags = train_command(corpus, output_dir)[3:]
    return jax_command(*flags, "--prepared-data", prepared, "--train-steps", str(steps),
                       "--eval-steps", "3", "--checkpoint-steps", "3", "--dropout", "0.0")


@pytest.mark.slow
def test_a_run_trained_under_jax_moves_to_tensorflow_and_back(toy_corpus, prepared, tmp_path,
                                                              capsys):
    import keras

    from keras_transformer import cli

    assert keras.backend.backend() == "tensorflow"
    run_dir = tmp_path / "run"
    trained = jax_train(toy_corpus, prepared, run_dir, 6)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "training done: step 0 -> 6" in trained.stdout
    checkpoint = json.loads((run_dir / "checkpoints" / "ckpt-6.json").read_text())
    assert checkpoint["backend"] == "jax" and checkpoint["data_position"] == 6

    # Under TensorFlow (this test process's backend, the command in-process): averaged,
    # evaluated, exported.
    capsys.readouterr()
    assert cli.main(["average", "--run-dir", str(run_dir), "--last", "2"]) == 0
    assert "ckpt-3.weights.h5, ckpt-6.weights.h5" in capsys.readouterr().out
    assert cli.main(["evaluate", "--run-dir", str(run_dir), "--src", str(toy_corpus["dev.src"]),
                     "--ref", str(toy_corpus["dev.tgt"]), "--beam", "2",
                     "--precision", "float32"]) == 0  # auto would be bf16 on some CPUs
    tf_score = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cli.main(["export", "--run-dir", str(run_dir), "--output-dir",
                     str(tmp_path / "export")]) == 0

    # The same weights evaluated under JAX (no TensorFlow) score the same.
    evaluated = jax_command("evaluate", "--run-dir", str(run_dir), "--src",
                            str(toy_corpus["dev.src"]), "--ref", str(toy_corpus["dev.tgt"]),
                            "--beam", "2", "--precision", "float32")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads(evaluated.stdout.strip().splitlines()[-1])["sacrebleu"] == pytest.approx(
        tf_score["sacrebleu"], abs=0.01)

    # And score the dev pairs alike (keras-transformer score).
    scoring = ["score", "--run-dir", str(run_dir), "--src", str(toy_corpus["dev.src"]),
               "--tgt", str(toy_corpus["dev.tgt"]), "--precision", "float32"]
    capsys.readouterr()
    assert cli.main(scoring) == 0
    tf_scores = [float(x) for line in capsys.readouterr().out.splitlines()
                 for x in line.split("\t")]
    scored = jax_command(*scoring)
    assert scored.returncode == 0, scored.stderr[-3000:]
    jax_scores = [float(x) for line in scored.stdout.splitlines() for x in line.split("\t")]
    assert len(tf_scores) == 3 * 40 and jax_scores == pytest.approx(tf_scores, abs=2e-3)

    # Resumed under JAX from the last checkpoint, at its data position.
    resumed = jax_train(toy_corpus, prepared, run_dir, 9)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "at step 6, training batch 6" in resumed.stdout
    assert "training done: step 6 -> 9" in resumed.stdout


def test_tensorflow_only_commands_are_refused_by_name_under_jax(toy_corpus, tmp_path):
    refused = jax_command("export", "--run-dir", str(tmp_path))
    assert refused.returncode == 2
    assert "export runs under TensorFlow only" in refused.stderr
    assert "KERAS_BACKEND=tensorflow" in refused.stderr
    flags = train_command(toy_corpus, tmp_path / "run")[3:]
    refused = jax_command(*flags, "--strategy", "mirrored")
    assert refused.returncode == 2
    assert "--strategy mirrored is a TensorFlow strategy" in refused.stderr



# As NO_TENSORFLOW, also counting the compilations of the training step (JAX's own log).
COUNTING_COMPILES = """
import logging, sys
for name in ("tensorflow", "tensorflow_text", "tensorflow_datasets"):
    sys.modules[name] = None
import jax
jax.config.update("jax_log_compiles", True)
compiles = []
class Count(logging.Handler):
    def emit(self, record):
        message = record.getMessage()
        if "XLA compilation" in message and "train_step" in message:
            compiles.append(message)
logging.getLogger("jax").addHandler(Count())
from keras_transformer.cli import main
code = main(sys.argv[1:])
print("train_step compiled", len(compiles))
sys.exit(code)
"""


@pytest.mark.slow
def test_jax_compiles_the_training_step_once_per_static_shape(toy_corpus, prepared, tmp_path):
    """Under JAX, pad_to_bucket is on by default: the step is compiled once per static shape
    of the batches trained on (at most the 5 coarse cells of max_length 32), fewer than the
    length cells those batches span."""
    from pipelines import buckets
    from pipelines.prepared import BatchPlan, PreparedData

    steps, data = 16, PreparedData(prepared)
    shapes = {kind: {batch[1].shape for batch in BatchPlan(
        data, 256, 32, 1234, devices=1, static=kind == "static").batches(0, steps)}
        for kind in ("cells", "static")}
    assert len(shapes["static"]) <= len(buckets.static_boundaries(32)) < len(shapes["cells"])
    flags = train_command(toy_corpus, tmp_path / "run")[3:]
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", COUNTING_COMPILES, *flags, "--prepared-data", prepared,
         "--train-steps", str(steps), "--eval-steps", str(steps), "--dropout", "0.0"],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pad_to_bucket True [auto: jax compiles the step once per batch shape]" in " ".join(
        result.stdout.split())
    assert f"train_step compiled {len(shapes['static'])}\n" in result.stdout
