"""A run's TensorBoard events: one writer per split (RUN/logs/train, RUN/logs/dev), x = the
optimizer step, training figures every log_steps, dev figures at each evaluation, the config
once; a resumed run's steps continue without duplicates (read as TensorBoard reads them), and
its progress bar counts the run's steps from where it resumed."""

import os
import shutil
import subprocess
import sys

import pytest


TRAIN_TAGS = {"loss", "learning_rate", "tokens_per_s"}
DEV_TAGS = {"loss", "perplexity", "token_accuracy"}


def read_events(folder):
    """{tag: [(step, value), ...]} of the events in `folder`, as TensorBoard's server reads
    them (its plugin accumulator: the points orphaned by a restart dropped); text decoded."""
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    accumulator = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    accumulator.Reload()
    events = {}
    for tag in accumulator.Tags()["tensors"]:
        points = []
        for event in accumulator.Tensors(tag):
            value = tensor_util.make_ndarray(event.tensor_proto)
            value = value.item() if value.dtype.kind != "O" else value.item().decode()
            points.append((event.step, value))
        events[tag] = points
    return events


def steps(points):
    return [step for step, _ in points]


def test_the_events_of_a_run_by_optimizer_step(tiny_run):
    # tiny_run: 20 steps, log_steps 5, eval_steps 10 (tests/conftest.py)
    logs = tiny_run / "logs"
    assert sorted(p.name for p in logs.iterdir()) == ["dev", "train"]
    assert all(p.is_file() for p in (logs / "train").iterdir())  # no logs/train/train
    train = read_events(logs / "train")
    assert set(train) == TRAIN_TAGS | {"config"}
    for tag in TRAIN_TAGS:
        assert steps(train[tag]) == [5, 10, 15, 20], tag
    [(step, text)] = train["config"]
    assert step == 0 and "log_steps 5" in text and "eval_steps 10" in text
    # the schedule's warmup: the learning rate grows over the first 50 steps
    rates = [value for _, value in train["learning_rate"]]
    assert rates == sorted(rates) and rates[0] > 0
    assert all(value > 0 for _, value in train["tokens_per_s"])
    assert all(0 < value < 10 for _, value in train["loss"])

    dev = read_events(logs / "dev")
    assert set(dev) == DEV_TAGS
    for tag in DEV_TAGS:
        assert steps(dev[tag]) == [10, 20], tag
    import json

    summary = json.loads((tiny_run / "config.json").read_text())  # the run's own numbers
    assert summary["run"]["log_steps"] == 5


@pytest.mark.slow
def test_a_resumed_run_continues_its_steps_and_dev_bleu_is_logged(run_copy, toy_corpus,
                                                                  capsys):
    from keras_transformer.training import train
    from tests.conftest import toy_config

    # As if killed after step 20 having saved only the checkpoint of step 10: the events of
    # steps 15 and 20 are orphans that the resumed process writes again.
    for path in (run_copy / "checkpoints").glob("ckpt-20.*"):
        path.unlink()
    (run_copy / "model.keras").unlink()
    # keep_best off: best.keras, written at each improving evaluation, is not what is tested.
    train(toy_config(toy_corpus, run_copy, train_steps=30, bleu_steps=10, verbose=1,
                     keep_best=False))
    # The progress bar: the run's steps, not Keras' epochs, from the step it resumed at.
    err = capsys.readouterr().err
    assert "training: step 30/30 (100%)" in err and "Epoch" not in err
    assert "step 10/30" in err
    train_events = read_events(run_copy / "logs" / "train")
    for tag in TRAIN_TAGS:
        assert steps(train_events[tag]) == [5, 10, 15, 20, 25, 30], tag
    assert steps(train_events["config"]) == [0, 10]  # each process's, at its start step
    dev = read_events(run_copy / "logs" / "dev")
    for tag in DEV_TAGS:
        assert steps(dev[tag]) == [10, 20, 30], tag
    assert steps(dev["bleu"]) == [20, 30]  # bleu_steps given to the resumed process


def short_pairs(corpus, folder, most_words=3):
    """The pairs of `corpus` whose source has at most `most_words` words, written to `folder`:
    batches of one padded shape (toy corpus, max_length 32), so that JAX compiles the training
    and the dev step once each rather than once per length cell of the whole corpus."""
    folder.mkdir()
    paths = {}
    for split in ("train", "dev"):
        pairs = [(src, tgt) for src, tgt in zip(
            corpus[f"{split}.src"].read_text(encoding="utf-8").splitlines(),
            corpus[f"{split}.tgt"].read_text(encoding="utf-8").splitlines())
            if len(src.split()) <= most_words]
        for side, lines in zip(("src", "tgt"), zip(*pairs)):
            paths[f"{split}.{side}"] = folder / f"{split}.{side}"
            paths[f"{split}.{side}"].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


@pytest.mark.slow
def test_the_events_on_jax(toy_corpus, tmp_path):
    pytest.importorskip("jax")
    from tests.conftest import RUNTIME_CLI, RUNTIME_PRESET

    run_dir = tmp_path / "run"
    corpus = short_pairs(toy_corpus, tmp_path / "corpus")
    command = [sys.executable, *RUNTIME_CLI, "train", "--preset", RUNTIME_PRESET,
               "--dataset", "text", "--train-src", str(corpus["train.src"]),
               "--train-tgt", str(corpus["train.tgt"]), "--dev-src",
               str(corpus["dev.src"]), "--dev-tgt", str(corpus["dev.tgt"]),
               "--vocab-size", "400", "--tokens-per-batch", "256", "--max-length", "32",
               "--train-steps", "10", "--eval-steps", "5", "--log-steps", "5",
               "--precision", "float32", "--verbose", "0", "--output-dir", str(run_dir),
               "--num-layers", "1", "--no-tune"]  # one layer each side: half of what XLA compiles
    result = subprocess.run(command, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"},
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert result.returncode == 0, result.stderr[-3000:]
    train = read_events(run_dir / "logs" / "train")
    for tag in TRAIN_TAGS:
        assert steps(train[tag]) == [5, 10], tag
    dev = read_events(run_dir / "logs" / "dev")
    for tag in DEV_TAGS:
        assert steps(dev[tag]) == [5, 10], tag
    shutil.rmtree(run_dir)
