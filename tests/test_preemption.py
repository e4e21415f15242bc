"""Preemption and one writer per run, with real processes and signals: SIGTERM at a random step
checkpoints that step and the resumed run has the per-step losses of an uninterrupted one; a
second `train` on a run that is being trained is refused naming the holder; a SIGKILLed
holder leaves no lock behind. The process that gets the signal and the lock holders are child
processes; the other commands run in this one (`cli.main`)."""

import json
import os
import pathlib
import random
import re
import signal
import socket
import subprocess
import sys

import pytest

from tests.training_helpers import train_command, wait_for, write_corpus

STEPS = 8
# One optimizer step per Keras epoch (eval_steps 1), so that `--verbose 2` prints each step's
# training loss (Keras' line per epoch) and its dev loss; two accumulated batches a step, so
# that the signal must wait for the step's second batch. No best.keras: a dev loss that
# improves at most steps would write one at each (best.keras is tests/test_early_stopping.py's).
# One layer each side (the tiny preset's two, halved): half the graph each process traces.
SETTINGS = ("--train-steps", str(STEPS), "--eval-steps", "1", "--grad-accum-steps", "2",
            "--checkpoint-minutes", "60", "--shard-pairs", "60", "--verbose", "2",
            "--no-keep-best", "--num-layers", "1")


def step_losses(*outputs):
    """({step: training loss}, {step: (dev loss, dev perplexity)}) from the output of `train
    --verbose 2` (later outputs win). A step that a signal ended has no dev pass."""
    train, dev = {}, {}
    for output in outputs:
        chunks = re.split(r"^Epoch (\d+)/\d+$", output, flags=re.M)[1:]
        train.update((int(step), re.search(r" - loss: (\S+)", text).group(1))
                     for step, text in zip(chunks[::2], chunks[1::2]))
        dev.update((int(step), values) for step, *values in re.findall(
            r"^step (\d+): validation: val_loss (\S+), val_perplexity (\S+),", output, re.M))
    return train, dev


def lock_holder(run_dir):
    try:
        return json.loads((run_dir / ".lock").read_text() or "{}")
    except (OSError, ValueError):
        return {}


@pytest.mark.slow
def test_sigterm_checkpoints_the_step_and_the_resumed_run_trains_as_an_uninterrupted_one(
        tmp_path, capsys, graph_optimizer_on):  # in-process steps equal to the child's
    from keras_transformer import cli

    corpus = write_corpus(tmp_path / "corpus")
    whole_dir, pieces_dir = tmp_path / "whole", tmp_path / "pieces"
    command = train_command(corpus, pieces_dir, *SETTINGS)
    out, err = tmp_path / "pieces.out", tmp_path / "pieces.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        pieces = subprocess.Popen(command, stdout=stdout, stderr=stderr,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})

    # One writer per run: a second `train` into the run being trained is refused at once.
    wait_for(lambda: lock_holder(pieces_dir).get("pid") == pieces.pid, pieces)
    capsys.readouterr()
    assert cli.main(command[3:]) == 2
    refusal = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"keras-transformer train: error: cannot start training: {pieces_dir} is in use by "
        rf"pid {pieces.pid} on host {re.escape(socket.gethostname())} since "
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(training\); .*", refusal), refusal

    # SIGTERM once the run has trained a random number of steps.
    at = random.Random().randint(2, STEPS - 4)
    wait_for(lambda: len(re.findall(r"^step \d+: validation",
                                    out.read_text(), re.M)) >= at,
             pieces)
    pieces.send_signal(signal.SIGTERM)
    pieces.wait(timeout=300)
    stderr = err.read_text()
    assert pieces.returncode == 75, stderr[-2000:]
    line = stderr.strip().splitlines()[-1]
    stopped = re.fullmatch(r"keras-transformer train: stopped by SIGTERM: checkpoint (\S+) saved "
                           r"at step (\d+); run the same command to resume from it", line)
    assert stopped, line
    step = int(stopped.group(2))
    assert at <= step < STEPS
    weights = pathlib.Path(stopped.group(1))
    sidecar = json.loads(weights.with_name(f"ckpt-{step}.json").read_text())
    assert weights.name == f"ckpt-{step}.weights.h5"
    assert sidecar["step"] == step and sidecar["data_position"] == 2 * step  # 2 batches a step
    assert not (pieces_dir / "model.keras").exists()

    # A SIGKILLed writer leaves no lock: a lock holder killed with SIGKILL, then `train` again,
    # which resumes at the saved step and is not refused.
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pipelines.lock import FolderLock; "
        f"lock = FolderLock({str(pieces_dir)!r}, 'training').acquire(); print('held', flush=True); "
        "time.sleep(600)")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    assert lock_holder(pieces_dir)["pid"] == holder.pid
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    capsys.readouterr()
    assert cli.main(command[3:]) == 0
    resumed = capsys.readouterr().out
    assert f"at step {step}, training batch {2 * step}" in resumed
    assert re.search(rf"training done: step {step} -> {STEPS} ", resumed)

    # The run left alone, from start to end.
    assert cli.main(train_command(corpus, whole_dir, *SETTINGS)[3:]) == 0
    (train, dev) = step_losses(capsys.readouterr().out)
    (resumed_train, resumed_dev) = step_losses(out.read_text(), resumed)
    # The same batches, the same weights: the same losses, step by step.
    assert sorted(train) == sorted(resumed_train) == list(range(1, STEPS + 1))
    assert resumed_train == train
    assert sorted(resumed_dev) == [s for s in range(1, STEPS + 1) if s != step]
    assert resumed_dev == {s: dev[s] for s in resumed_dev}


def test_checkpoint_on_signal_is_a_train_flag_and_a_saved_setting(tiny_run):
    from keras_transformer.cli import build_parser
    from keras_transformer.runs import Run

    args = build_parser().parse_args(["train", "--no-checkpoint-on-signal"])
    assert args.checkpoint_on_signal is False
    assert Run(tiny_run).config.checkpoint_on_signal is True
    assert json.loads((tiny_run / "config.json").read_text())["run"]["checkpoint_on_signal"] \
        is True
