"""Dev metrics in Keras' logs: the greedy dev translation's BLEU and chrF reach a caller's
callbacks as val_bleu / val_chrf at the step they are computed, so Keras' own CSVLogger,
EarlyStopping(monitor="val_bleu") and ModelCheckpoint(monitor="val_bleu") work when given to
`train(callbacks=...)`; a stop that such a callback asks for is the run's early stop, saved
with its checkpoint like one of its own."""

import csv
import json
import pathlib
import re

import keras
import pytest

from keras_transformer.training.callbacks import as_logs
from keras_transformer.training.events import Outcome


def test_dev_figures_take_keras_validation_names():
    assert as_logs({"bleu": 12.5, "chrf": 40.0}) == {"val_bleu": 12.5, "val_chrf": 40.0}
    assert as_logs({"bleu": 1.0, "en-fr/bleu": 2.0, "en-fr/chrf": 3.0, "val_loss": 4.0}) == {
        "val_bleu": 1.0, "en-fr/val_bleu": 2.0, "en-fr/val_chrf": 3.0, "val_loss": 4.0}


def test_an_early_stop_is_the_reason_even_after_a_limit_in_the_same_step():
    outcome = Outcome()
    outcome.stop("reached train_steps=20")
    outcome.stop("time limit of 1 minutes")  # the first reason stays
    assert (outcome.reason, outcome.early) == ("reached train_steps=20", False)
    outcome.stop("early stopping: no improvement of dev loss in 2 evaluations", early=True)
    outcome.stop("early stopping by a callback at step 20", early=True)
    assert outcome.reason == "early stopping: no improvement of dev loss in 2 evaluations"
    assert outcome.early


class BatchLogs(keras.callbacks.Callback):
    """A caller's callback: the batches (counted from 1 over the run) whose logs hold each
    dev figure."""

    def __init__(self):
        super().__init__()
        self.batches, self.seen = 0, {}

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        for key in ("val_bleu", "val_chrf", "val_loss"):
            if key in logs:
                self.seen.setdefault(key, []).append(self.batches)


@pytest.mark.slow  # a short training of the runtime preset, then 5 steps more (~40 s)
def test_keras_csv_logger_and_early_stopping_on_val_bleu_given_to_train(
        toy_corpus, runtime_preset, tmp_path, capsys):
    from keras_transformer.runs import Run
    from keras_transformer.training import train
    from tests.conftest import toy_config

    every, patience = 5, 2  # a BLEU evaluation every Keras epoch (eval_steps = bleu_steps)
    config = toy_config(toy_corpus, tmp_path / "run", train_steps=100, eval_steps=every,
                        bleu_steps=every, checkpoint_steps=every, bleu_sentences=20)
    log, best_weights = tmp_path / "dev.csv", tmp_path / "best.weights.h5"
    batch_logs = BatchLogs()
    # No improvement after the first epoch can reach min_delta=100 BLEU points: Keras stops
    # at the end of epoch 1 + patience.
    summary = train(config, callbacks=[
        keras.callbacks.CSVLogger(str(log)),
        keras.callbacks.EarlyStopping(monitor="val_bleu", mode="max", patience=patience,
                                      min_delta=100.0),
        keras.callbacks.ModelCheckpoint(str(best_weights), monitor="val_bleu", mode="max",
                                        save_best_only=True, save_weights_only=True),
        batch_logs])
    out = capsys.readouterr().out

    stop = every * (1 + patience)
    assert summary["step"] == stop < config.train_steps
    assert summary["stopped"] == f"early stopping by a callback at step {stop}"
    # The CSV: one row per Keras epoch, val_bleu and val_chrf beside the loss and val_loss,
    # the figures the run printed at those steps.
    with log.open(newline="") as file:
        rows = list(csv.DictReader(file))
    assert {"epoch", "loss", "val_loss", "val_bleu", "val_chrf"} <= set(rows[0])
    assert [int(row["epoch"]) for row in rows] == list(range(patience + 1))
    printed = {int(step): (float(bleu), float(chrf)) for step, bleu, chrf in re.findall(
        r"^step (\d+): dev BLEU \(greedy, 20 sentences\) (\S+), chrF (\S+)$", out, re.M)}
    assert sorted(printed) == [every * (i + 1) for i in range(patience + 1)]
    for index, row in enumerate(rows):
        bleu, chrf = printed[every * (index + 1)]
        assert float(row["val_bleu"]) == pytest.approx(bleu, abs=0.006)
        assert float(row["val_chrf"]) == pytest.approx(chrf, abs=0.006)
    # What Keras' rule gives on the logged values is where the run stopped.
    best, wait, stopped_epoch = -float("inf"), 0, None
    for epoch, row in enumerate(rows):
        if float(row["val_bleu"]) - 100.0 > best:
            best, wait = float(row["val_bleu"]), 0
        else:
            wait += 1
            if wait >= patience and epoch > 0:
                stopped_epoch = epoch
                break
    assert every * (stopped_epoch + 1) == stop
    assert best_weights.is_file()  # ModelCheckpoint found val_bleu too
    # In the batches' logs at the very steps they were computed (the dev loss: at epoch end).
    assert batch_logs.seen.get("val_bleu") == [every * (i + 1) for i in range(patience + 1)]
    assert batch_logs.seen["val_chrf"] == batch_logs.seen["val_bleu"]
    assert "val_loss" not in batch_logs.seen

    # The stop is the run's, saved with its checkpoint: `train` again says so and trains on
    # only when asked to.
    run = Run(tmp_path / "run")
    assert run.checkpoints()[-1].endswith(f"ckpt-{stop}.weights.h5")
    saved = json.loads(pathlib.Path(run.checkpoint_dir / f"ckpt-{stop}.json").read_text())
    assert saved["state"]["early_stopping"]["stopped_step"] == stop
    assert saved["state"]["early_stopping"]["stopped_by"] == "a callback"
    again = train(config)
    assert again["stopped"] == f"had stopped early at step {stop}"
    assert re.search(rf"stopped early at step {stop} \(a callback given to train stopped it; "
                     r".*only with --continue-stopped\.$", capsys.readouterr().out, re.M)
    # Asked to, it trains on (here to step 20), the stop forgotten.
    more = train(toy_config(toy_corpus, tmp_path / "run", train_steps=20, eval_steps=every,
                            bleu_steps=every, checkpoint_steps=every, bleu_sentences=20),
                 continue_stopped=True)
    assert (more["step"], more["stopped"]) == (20, "reached train_steps=20")
    assert f"continuing a run that stopped early at step {stop}" in capsys.readouterr().out
    saved = json.loads(pathlib.Path(run.checkpoint_dir / "ckpt-20.json").read_text())
    assert saved["state"]["early_stopping"]["stopped_step"] is None
    assert "stopped_by" not in saved["state"]["early_stopping"]


@pytest.mark.slow  # a model of the runtime preset fitted 4 steps on dev batches (~15 s)
def test_the_dev_callbacks_put_their_figures_in_a_model_fit_of_your_own(tiny_run):
    from keras_transformer.runs import Run
    from keras_transformer.training.callbacks import (DevBleu, DevLoss, DevTranslation,
                                                      Validation)
    from keras_transformer.training.inputs import dev_data
    from keras_transformer.training.trainer import compile_model

    run = Run(tiny_run)
    model = run.build_model()
    _, loss = compile_model(model, run.config)
    dev, (sources, references) = dev_data(run.config, run)
    batch_logs = BatchLogs()
    # No step function, no run: the optimizer's step, and the figures go to the logs only.
    history = model.fit(dev.repeat(), steps_per_epoch=2, epochs=2, verbose=0, shuffle=False,
                        callbacks=[
                            Validation(DevLoss(dev, loss)),
                            DevBleu(DevTranslation(run.vocabulary(),
                                                   (sources[:8], references[:8]), 32), every=2),
                            batch_logs])
    assert {"loss", "val_loss", "val_perplexity", "val_token_accuracy", "val_bleu",
            "val_chrf"} <= set(history.history)
    assert len(history.history["val_bleu"]) == len(history.history["val_loss"]) == 2
    assert batch_logs.seen["val_bleu"] == [2, 4]
