"""Early stopping and the best model on dev: a run that has stopped improving stops, and the
weights of its best dev evaluation are kept (fairseq's `--patience` and `checkpoint_best.pt`,
OpenNMT-tf's `early_stopping`).

    evaluations = Evaluations("loss", min_delta=0.0, every=500, train_steps=20000)
    early = EarlyStopping(evaluations, patience=2, run=run)
    best = BestModel(evaluations, run)
    evaluations.restore(checkpoint.state)      # the counters of the checkpoint resumed from
    early.had_stopped(continue_stopped=False)  # a run that stopped before: the line to say
    model.fit(..., callbacks=in_order([validation, early, best, checkpoint, ...]))

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
evaluation and makes it first (`trainer.catch_up`).
"""

import keras
from tqdm import tqdm

from keras_transformer.training.events import EVALUATED


class EarlyStopping(keras.callbacks.Callback):
    """Stops training after `patience` counted evaluations in a row without an improvement
    (the run's `Evaluations` counts them), and names best.keras in the run's decoding choice.

    Args:
        evaluations: the run's `Evaluations` (its metric is the one followed).
        patience: evaluations without an improvement before stopping (0: never stop).
        run: the `Run` (where best.keras is).
        keep: best.keras is written (the chief of a run with keep_best; False for a worker
            that is not the chief, or `--no-keep-best`).
    """

    needs = (EVALUATED,)

    def __init__(self, evaluations, patience, run, keep=True):
        super().__init__()
        self.evaluations, self.patience, self.run, self.keep = evaluations, patience, run, keep
        self.metric = evaluations.metric
        self.reason = None  # why it stopped this run, in a few words
        evaluations.listen(self.on_evaluation)

    # Before training.
    def had_stopped(self, continue_stopped=False):
        """For a run that stopped early before (its checkpoint says so): the line to say and
        None to train on; with `continue_stopped`, the counters start again (the best is
        kept) and None."""
        record = self.evaluations.record
        if record.stopped_step is None:
            return None
        if not continue_stopped:
            self.reason = f"had stopped early at step {record.stopped_step}"
            return (f"{self.run.directory} stopped early at step {record.stopped_step} (no "
                    f"improvement of dev {self.metric} in {record.without_improvement} "
                    f"evaluations; {self._best_text()}): it trains on to train_steps "
                    f"{self.evaluations.train_steps} only with --continue-stopped.")
        _say(f"continuing a run that stopped early at step {record.stopped_step} "
             f"(--continue-stopped): patience counts again from this step")
        record.stopped_step, record.without_improvement = None, 0
        return None

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
        self.reason = (f"early stopping: no improvement of dev {self.metric} in "
                       f"{record.without_improvement} evaluations")
        if self.keep:
            from keras_transformer.decoding.decoder import Decoder

            Decoder.save_choice(
                self.run, model=self.run.BEST, weights=f"best dev {self.metric} "
                f"({record.best:.4f}) at step {record.best_step}",
                chosen_by=f"train: early stopping on dev {self.metric}")
        _say(f"early stopping at step {step}: dev {self.metric} has not improved by at least "
             f"{self.evaluations.min_delta:g} in {record.without_improvement} evaluations; "
             f"{self._best_text()}")

    def _best_text(self):
        record = self.evaluations.record
        text = f"the best, {self.metric} {record.best:.4f} at step {record.best_step}"
        if self.keep:
            return f"{text}, is {self.run.best_path}"
        return f"{text}, was not kept (keep_best is off here)"


class BestModel(keras.callbacks.Callback):
    """Writes best.keras and best.json (`Run.save_best`) at every evaluation that improves on
    the best one (the chief of a run with keep_best).

    Args:
        evaluations: the run's `Evaluations`.
        run: the `Run` that saves.
    """

    needs = (EVALUATED,)

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
