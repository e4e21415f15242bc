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

# Runs keras-transformer commands, one after another in one process (one JAX start for several
# questions), with KERAS_BACKEND=jax where importing TensorFlow, tensorflow-text or
# tensorflow-datasets fails (as on a GPU machine without them): argv[1] the answers' file,
# argv[2] the commands (JSON). Each answer has the command's exit status, its output and the
# compilations of the training step it caused (JAX's own log).
JAX_COMMANDS = """
import contextlib, io, json, logging, sys
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
answers = []
for arguments in json.loads(sys.argv[2]):
    out, err, before = io.StringIO(), io.StringIO(), len(compiles)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(arguments)
        except SystemExit as exit:  # a refusal by the command line's parser
            code = exit.code
    answers.append(dict(code=code, stdout=out.getvalue(), stderr=err.getvalue(),
                        train_step_compiles=len(compiles) - before))
assert not any(sys.modules.get(n) for n in ("tensorflow", "tensorflow_text",
                                            "tensorflow_datasets"))
json.dump(answers, open(sys.argv[1], "w", encoding="utf-8"))
"""


def jax_commands(folder, *commands):
    """Runs `commands` (argument lists) under JAX in one child process, in order; returns one
    answer per command (code, stdout, stderr, train_step_compiles). The children share a JAX
    compilation cache in `folder`: a program compiled in one (a training step of a shape) is
    read back in a later one, not compiled again."""
    answers = folder / f"answers-{len(list(folder.glob('answers-*')))}.json"
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu",
           "JAX_COMPILATION_CACHE_DIR": str(folder / "jax-cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    result = subprocess.run(
        [sys.executable, "-c", JAX_COMMANDS, str(answers), json.dumps(commands)],
        capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(answers.read_text(encoding="utf-8"))


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


def jax_train_flags(corpus, prepared, output_dir, steps):
    # train_command's first three items start the TensorFlow CLI; keep its flags only.
    return [*train_command(corpus, output_dir)[3:], "--prepared-data", prepared,
            "--train-steps", str(steps), "--eval-steps", "16", "--checkpoint-steps", "8",
            "--dropout", "0.0", "--num-layers", "1"]


STEPS = 16  # trained under JAX (checkpoints at 8 and 16); then resumed to STEPS + 2


@pytest.fixture(scope="module")
def jax_run(toy_corpus, prepared, tmp_path_factory):
    """A run trained STEPS steps under JAX in a child process without TensorFlow: (its folder,
    the folder of the children's compilation cache, the training's answer, with the
    compilations of its training step counted)."""
    folder = tmp_path_factory.mktemp("jax-run")
    run_dir = folder / "run"
    (trained,) = jax_commands(folder, jax_train_flags(toy_corpus, prepared, run_dir, STEPS))
    return run_dir, folder, trained


@pytest.mark.slow
def test_a_run_trained_under_jax_moves_to_tensorflow_and_back(toy_corpus, prepared, jax_run,
                                                              tmp_path, capsys):
    import keras

    from keras_transformer import cli

    assert keras.backend.backend() == "tensorflow"
    run_dir, folder, trained = jax_run
    assert trained["code"] == 0, trained["stderr"][-3000:]
    assert f"training done: step 0 -> {STEPS}" in trained["stdout"]
    checkpoint = json.loads((run_dir / "checkpoints" / f"ckpt-{STEPS}.json").read_text())
    assert checkpoint["backend"] == "jax" and checkpoint["data_position"] == STEPS

    # Under TensorFlow (this test process's backend, the command in-process): averaged,
    # evaluated, exported, and the dev pairs scored.
    capsys.readouterr()
    assert cli.main(["average", "--run-dir", str(run_dir), "--last", "2"]) == 0
    assert "ckpt-8.weights.h5, ckpt-16.weights.h5" in capsys.readouterr().out
    evaluating = ["evaluate", "--run-dir", str(run_dir), "--src", str(toy_corpus["dev.src"]),
                  "--ref", str(toy_corpus["dev.tgt"]), "--beam", "2",
                  "--precision", "float32"]  # auto would be bf16 on some CPUs
    assert cli.main(evaluating) == 0
    tf_score = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert cli.main(["export", "--run-dir", str(run_dir), "--output-dir",
                     str(tmp_path / "export")]) == 0
    scoring = ["score", "--run-dir", str(run_dir), "--src", str(toy_corpus["dev.src"]),
               "--tgt", str(toy_corpus["dev.tgt"]), "--precision", "float32"]
    capsys.readouterr()
    assert cli.main(scoring) == 0
    tf_scores = [float(x) for line in capsys.readouterr().out.splitlines()
                 for x in line.split("\t")]

    # Back under JAX (no TensorFlow), in one child: the same weights evaluated, the dev pairs
    # scored, then the run resumed from its last checkpoint.
    evaluated, scored, resumed = jax_commands(
        folder, evaluating, scoring, jax_train_flags(toy_corpus, prepared, run_dir, STEPS + 2))

    # The same weights evaluated under JAX score the same...
    assert evaluated["code"] == 0, evaluated["stderr"][-3000:]
    assert json.loads(evaluated["stdout"].strip().splitlines()[-1])["sacrebleu"] == (
        pytest.approx(tf_score["sacrebleu"], abs=0.01))
    # ... and score the dev pairs alike (keras-transformer score).
    assert scored["code"] == 0, scored["stderr"][-3000:]
    jax_scores = [float(x) for line in scored["stdout"].splitlines() for x in line.split("\t")]
    assert len(tf_scores) == 3 * 40 and jax_scores == pytest.approx(tf_scores, abs=2e-3)

    # Resumed under JAX from the last checkpoint, at its data position.
    assert resumed["code"] == 0, resumed["stderr"][-3000:]
    assert f"at step {STEPS}, training batch {STEPS}" in resumed["stdout"]
    assert f"training done: step {STEPS} -> {STEPS + 2}" in resumed["stdout"]


@pytest.mark.slow  # fresh interpreters on JAX
def test_tensorflow_only_commands_are_refused_by_name_under_jax(toy_corpus, tmp_path):
    flags = train_command(toy_corpus, tmp_path / "run")[3:]
    export, mirrored = jax_commands(tmp_path, ["export", "--run-dir", str(tmp_path)],
                                    [*flags, "--strategy", "mirrored"])
    assert export["code"] == 2
    assert "export runs under TensorFlow only" in export["stderr"]
    assert "KERAS_BACKEND=tensorflow" in export["stderr"]
    assert mirrored["code"] == 2
    assert "--strategy mirrored is a TensorFlow strategy" in mirrored["stderr"]


@pytest.mark.slow
def test_jax_compiles_the_training_step_once_per_static_shape(prepared, jax_run):
    """Under JAX, pad_to_bucket is on by default: the step is compiled once per static shape
    of the batches trained on (at most the 5 coarse cells of max_length 32), fewer than the
    length cells those batches span. (jax_run's training, the first in its compilation cache,
    compiles every program it runs.)"""
    from pipelines import buckets
    from pipelines.prepared import BatchPlan, PreparedData

    data = PreparedData(prepared)
    shapes = {kind: {batch[1].shape for batch in BatchPlan(
        data, 256, 32, 1234, devices=1, static=kind == "static").batches(0, STEPS)}
        for kind in ("cells", "static")}
    assert len(shapes["static"]) <= len(buckets.static_boundaries(32)) < len(shapes["cells"])
    _, _, trained = jax_run
    assert trained["code"] == 0, trained["stderr"][-3000:]
    assert "pad_to_bucket True [auto: jax compiles the step once per batch shape]" in " ".join(
        trained["stdout"].split())
    assert trained["train_step_compiles"] == len(shapes["static"]), trained["stderr"][-3000:]
