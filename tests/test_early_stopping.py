"""Early stopping and best.keras, with real runs of the `train` command: a run with a huge
train_steps stops on its own with one line, best.keras holds the best evaluation's weights
and decoding.json names it; a run killed mid-run (SIGKILL) and resumed stops at the same step
as an uninterrupted one; running the command again after the stop says that the run had
stopped, and trains on only with --continue-stopped."""

import json
import os
import re
import signal
import subprocess

import keras
import numpy as np
import pytest

from keras_transformer.errors import ConfigError
from keras_transformer.runs import Run, make_config
from keras_transformer.runs.run import average_checkpoints
from tests.training_helpers import train_command, wait_for

# Evaluations every 10 steps, a checkpoint at each (saved before that step's evaluation, so a
# run resumed from one owes it); an improvement must be 0.2 of dev loss at least, which the
# tiny model stops making after a few dozen steps.
SETTINGS = ("--train-steps", "100000", "--eval-steps", "10", "--checkpoint-steps", "10",
            "--early-stopping-patience", "2", "--early-stopping-min-delta", "0.2",
            "--keep-checkpoints", "100", "--checkpoint-minutes", "60",
            # one layer each side (the tiny preset's two, halved): half the graph each
            # training traces
            "--num-layers", "1")
STOP_LINE = (r"^early stopping at step (\d+): dev loss has not improved by at least 0\.2 in 2 "
             r"evaluations; the best, loss (\S+) at step (\d+), is (\S+)$")


def in_process(command):
    """`train_command`'s command line run by the command-line entry point in this process."""
    from keras_transformer import cli

    assert command[1:3] == ["-m", "keras_transformer.cli"], command
    return cli.main(command[3:])


def weights(model):
    return [keras.ops.convert_to_numpy(w) for w in model.weights]


@pytest.mark.slow  # three short trainings of the tiny preset (~1 minute on 2 cores)
def test_a_run_stops_on_its_own_keeps_its_best_and_resumes_to_the_same_decision(
        toy_corpus, tmp_path, capsys, graph_optimizer_on):  # in-process steps equal to the child's
    corpus = toy_corpus  # its prepared data may be in the session's cache already
    whole_dir, pieces_dir = tmp_path / "whole", tmp_path / "pieces"
    # The run killed (SIGKILL: no checkpoint of its own) after its second evaluation: a
    # process of its own, the one thing here that must be one.
    command = train_command(corpus, pieces_dir, *SETTINGS)
    out = tmp_path / "pieces.out"
    with out.open("w") as stdout:
        pieces = subprocess.Popen(command, stdout=stdout, stderr=subprocess.DEVNULL,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
    wait_for(lambda: (pieces_dir / "checkpoints" / "ckpt-20.json").is_file(), pieces)
    pieces.send_signal(signal.SIGKILL)
    pieces.wait(timeout=60)
    assert "early stopping" not in out.read_text()
    # The same command again resumes it; the uninterrupted run is the same command on a new
    # run directory. Both run in this process: the command line, not a new process, is what
    # is tested from here on.
    capsys.readouterr()
    assert in_process(command) == 0
    resumed = capsys.readouterr()
    assert in_process(train_command(corpus, whole_dir, *SETTINGS)) == 0
    stdout = capsys.readouterr().out

    stop = re.search(STOP_LINE, stdout, re.M)
    assert stop, stdout[-2000:]
    step, best_value, best_step = int(stop.group(1)), float(stop.group(2)), int(stop.group(3))
    assert stop.group(4) == str(whole_dir / "best.keras")
    assert step % 10 == 0 and 30 <= step < 100000 and best_step == step - 20
    assert re.search(rf"training done: step 0 -> {step} in .*, early stopping: no improvement "
                     r"of dev loss in 2 evaluations", stdout)
    assert len(re.findall(r"^early stopping", stdout, re.M)) == 1

    # Stopped, killed and resumed: the same decision at the same step, the same best.
    again = re.search(STOP_LINE, resumed.out, re.M)
    assert again, resumed.out[-2000:] + resumed.err[-2000:]
    assert (int(again.group(1)), int(again.group(3))) == (step, best_step)
    assert float(again.group(2)) == best_value
    resumed_at = int(re.search(r"^resumed from \S+ckpt-(\d+)\.weights\.h5 at step", resumed.out,
                               re.M).group(1))
    if resumed_at == 20:  # killed before ckpt-30: the evaluation at step 20 is made first
        assert re.search(r"^step 20: dev loss \S+ \(owed: the checkpoint resumed from was saved "
                         r"before this evaluation\)$", resumed.out, re.M), resumed.out

    # best.keras holds the weights of the best evaluation (the checkpoint of that step), and
    # the run decodes with it.
    whole_run = Run(whole_dir)
    record = whole_run.best()
    assert (record["step"], record["metric"]) == (best_step, "loss")
    assert record["value"] == pytest.approx(best_value, abs=5e-5)
    assert Run(pieces_dir).best() == record  # the same value, to the last bit
    best = whole_run.load_model(path=whole_run.best_path)
    checkpoint = whole_run.build_model()
    average_checkpoints(checkpoint, [whole_run.checkpoint_dir / f"ckpt-{best_step}.weights.h5"])
    for a, b in zip(weights(best), weights(checkpoint)):
        np.testing.assert_array_equal(a, b)
    final = whole_run.load_model(path=whole_run.model_path)
    assert any(not np.array_equal(a, b) for a, b in zip(weights(best), weights(final)))
    decoding = whole_run.decoding()
    assert decoding["model"] == "best.keras" and whole_run.decoding_model_path() == \
        whole_run.best_path
    assert f"at step {best_step}" in decoding["weights"]
    saved = json.loads((whole_dir / "checkpoints" / f"ckpt-{step}.json").read_text())
    assert saved["state"]["early_stopping"]["stopped_step"] == step

    # The same command again: the run had stopped, and says so; nothing is trained.
    capsys.readouterr()
    assert in_process(train_command(corpus, whole_dir, *SETTINGS)) == 0
    repeated = capsys.readouterr()
    assert re.search(rf"^{re.escape(str(whole_dir))} stopped early at step {step} .* it trains "
                     r"on to train_steps 100000 only with --continue-stopped\.$",
                     repeated.out, re.M), repeated.out[-2000:] + repeated.err[-2000:]
    assert "training done" not in repeated.out
    assert Run(whole_dir).checkpoints()[-1].endswith(f"ckpt-{step}.weights.h5")

    # Asked to (--continue-stopped), it trains on, extended by two evaluations.
    assert in_process(train_command(corpus, whole_dir, *SETTINGS, "--continue-stopped",
                                    "--train-steps", str(step + 20))) == 0
    extended = capsys.readouterr()
    assert f"continuing a run that stopped early at step {step} (--continue-stopped)" in \
        extended.out, extended.out[-2000:] + extended.err[-2000:]
    assert re.search(rf"training done: step {step} -> {step + 20} ", extended.out), \
        extended.out[-2000:]


def test_a_dev_metric_other_than_loss_needs_the_dev_translation():
    with pytest.raises(ConfigError, match=r"'early_stopping_metric' 'bleu' .*--bleu-steps"):
        make_config(early_stopping_metric="bleu")
    config = make_config(early_stopping_metric="chrf", bleu_steps=10)
    assert (config.early_stopping_metric, config.early_stopping_patience,
            config.keep_best) == ("chrf", 0, None)
    with pytest.raises(ConfigError, match="'early_stopping_patience' must be at least 0"):
        make_config(early_stopping_patience=-1)
