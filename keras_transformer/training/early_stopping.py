"""Early stopping and the best model on dev: a run that has stopped improving stops, and the
weights of its best dev evaluation are kept (fairseq's `--patience` and `checkpoint_best.pt`,
OpenNMT-tf's `early_stopping`).

    evaluations = Evaluations("loss", min_delta=0.0, every=500, train_steps=20000)
    evaluations.restore(checkpoint.state)      # the counters of the checkpoint resumed from
    stopped_before(evaluations, run, continue_stopped=False)  # a run that stopped: the line
    early = EarlyStopping(evaluations, patience=2, run=run, outcome=outcome)
    best = BestModel(evaluations, run)
    model.fit(..., callbacks=in_order([validation, early, best, checkpoint, ...])
                             + [CallbackStop(evaluations, outcome, step_fn)])

The metric is the dev loss (the `Validation` pass every eval_steps) or the BLEU or chrF of the
greedy dev translation (`DevBleu`, every bleu_steps). The run's `Evaluations` (training/events.py)
judges each evaluation: it improves on the best one when it is better by at least `min_delta`;
then `BestModel` writes best.keras and best.json (`Run.save_best`). After `patience`
evaluations in a row without one (0: never), `EarlyStopping` stops training with one line that
says why, at which step, and where the best model is, and the run's decoding.json names
best.keras (translate, evaluate and export then decode with it). Both only listen: neither
evaluates nor keeps counters of its own.

The counters (`Record`) are saved in every checkpoint (`Evaluations.state`), so a run that is
stopped, killed and resumed decides as one that ran in one piece. Only evaluations at the
metric's own steps count (multiples of `every`, and train_steps): a pass made elsewhere (at a
time limit) does not. A checkpoint is saved before the evaluation of its step (the periodic
one), or instead of it (on a signal, which skips the pass): a run resumed from it owes that
evaluation and makes it first (`Evaluations.catch_up`).

A callback of the caller's may stop the run too: Keras' `EarlyStopping(monitor="val_bleu",
mode="max")` reads the dev figures that `DevBleu` puts in Keras' logs. `CallbackStop`, after
every other callback, records such a stop as the run's early stop, saved in the checkpoints as
one of ours is: running `train` again says that the run had stopped, and trains on only with
--continue-stopped.
"""

import keras
from tqdm import tqdm

from keras_transformer.training.events import Outcome


class EarlyStopping(keras.callbacks.Callback):
    """Stops training after `patience` counted evaluations in a row without an improvement
    (the run's `Evaluations` counts them), and names best.keras in the run's decoding choice.

    Args:
        evaluations: the run's `Evaluations` (its metric is the one followed).
        patience: evaluations without an improvement before stopping (0: never stop).
        run: the `Run` (where best.keras is).
        keep: best.keras is written (the chief of a run with keep_best; False for a worker
            that is not the chief, or `--no-keep-best`).
        outcome: the run's `Outcome`, where the stop's reason goes.
    """

    def __init__(self, evaluations, patience, run, keep=True, outcome=None):
        super().__init__()
        self.evaluations, self.patience, self.run, self.keep = evaluations, patience, run, keep
        self.outcome = outcome if outcome is not None else Outcome()
        self.metric = evaluations.metric
        evaluations.listen(self.on_evaluation)

    # On each evaluation.
    def on_evaluation(self, evaluation):
        if evaluation.owed and evaluation.counted:
            _say(f"step {evaluation.step}: dev {self.metric} "
                 f"{self.evaluations.value(evaluation):.4f} (owed: the checkpoint resumed from "
                 "was saved before this evaluation)")
        if not evaluation.counted or evaluation.improved:
            return
        record = self.evaluations.record
        if self.patience and record.without_improvement >= self.patience:
            self._stop(evaluation.step)

    def _stop(self, step):
        record = self.evaluations.record
        self.evaluations.stop(step)
        self.model.stop_training = True
        self.outcome.stop(f"early stopping: no improvement of dev {self.metric} in "
                          f"{record.without_improvement} evaluations", early=True)
        if self.keep:
            from keras_transformer.decoding.decoder import Decoder

            Decoder.save_choice(
                self.run, model=self.run.BEST, weights=f"best dev {self.metric} "
                f"({record.best:.4f}) at step {record.best_step}",
                chosen_by=f"train: early stopping on dev {self.metric}")
        _say(f"early stopping at step {step}: dev {self.metric} has not improved by at least "
             f"{self.evaluations.min_delta:g} in {record.without_improvement} evaluations; "
             f"{_best_text(self.evaluations, self.run, self.keep)}")


def _best_text(evaluations, run, keep):
    record = evaluations.record
    if record.best is None:
        return f"no dev {evaluations.metric} evaluated yet"
    text = f"the best, {evaluations.metric} {record.best:.4f} at step {record.best_step}"
    if keep:
        return f"{text}, is {run.best_path}"
    return f"{text}, was not kept (keep_best is off here)"


def stopped_before(evaluations, run, continue_stopped=False, keep=True):
    """For a run that stopped early before (its checkpoint's counters say so): the line to say,
    and it trains no more; with `continue_stopped`, the counters start again (the best is
    kept) and None, as for a run that had not stopped. `keep`: best.keras is kept."""
    record = evaluations.record
    if record.stopped_step is None:
        return None
    if continue_stopped:
        _say(f"continuing a run that stopped early at step {record.stopped_step} "
             f"(--continue-stopped): patience counts again from this step")
        record.stopped_step, record.stopped_by, record.without_improvement = None, None, 0
        return None
    why = (f"{record.stopped_by} given to train stopped it" if record.stopped_by else
           f"no improvement of dev {evaluations.metric} in {record.without_improvement} "
           "evaluations")
    return (f"{run.directory} stopped early at step {record.stopped_step} ({why}; "
            f"{_best_text(evaluations, run, keep)}): it trains on to train_steps "
            f"{evaluations.train_steps} only with --continue-stopped.")


class CallbackStop(keras.callbacks.Callback):
    """Records a stop that none of the run's callbacks asked for (a caller's callback set
    `model.stop_training`, as Keras' EarlyStopping(monitor="val_bleu", mode="max") does) as the
    run's early stop: the counters note the step (`Evaluations.stop`, saved with the
    checkpoint at the end of training) and the `Outcome` the reason. Runs after every other
    callback in each hook: the trainer puts it last.

    Args:
        evaluations: the run's `Evaluations`.
        outcome: the run's `Outcome` (the run's own stops are noted there before this runs).
        step_fn: returns the current optimizer step.
    """

    def __init__(self, evaluations, outcome, step_fn):
        super().__init__()
        self.evaluations, self.outcome, self.step_fn = evaluations, outcome, step_fn

    def _check(self):
        if not self.model.stop_training or self.outcome.reason is not None:
            return
        step = self.step_fn()
        self.evaluations.stop(step, by="a callback")
        self.outcome.stop(f"early stopping by a callback at step {step}", early=True)
        _say(f"early stopping at step {step}: a callback given to train stopped the run; "
             "`train` trains on only with --continue-stopped")

    def on_train_batch_end(self, batch, logs=None):
        self._check()

    def on_epoch_end(self, epoch, logs=None):
        self._check()


class BestModel(keras.callbacks.Callback):
    """Writes best.keras and best.json (`Run.save_best`) at every evaluation that improves on
    the best one (the chief of a run with keep_best).

    Args:
        evaluations: the run's `Evaluations`.
        run: the `Run` that saves.
    """

    def __init__(self, evaluations, run):
        super().__init__()
        self.evaluations, self.run = evaluations, run
        evaluations.listen(self.on_evaluation)

    def on_evaluation(self, evaluation):
        if evaluation.improved:
            self.run.save_best(self.model, evaluation.step, self.evaluations.metric,
                               self.evaluations.value(evaluation))


def _say(line):
    """Prints a line without breaking an active progress bar."""
    tqdm.write(line)
