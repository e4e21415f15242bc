"""Early stopping and the best model on dev: a run that has stopped improving stops, and the
weights of its best dev evaluation are kept (fairseq's `--patience` and `checkpoint_best.pt`,
OpenNMT-tf's `early_stopping`).

    early = EarlyStopping(validation, "loss", patience=2, min_delta=0.0, every=500,
                          train_steps=20000, step_fn=step_fn, run=run, state=checkpoint.state)
    early.had_stopped(continue_stopped=False)   # a run that stopped before: the line to say
    early.catch_up(model)                       # the evaluation a checkpoint owed; True: stop
    model.fit(..., callbacks=[validation, early, checkpoint, ...])

The metric is the dev loss (the `Validation` pass every eval_steps) or the BLEU or chrF of the
greedy dev translation (`DevBleu`, every bleu_steps). An evaluation improves on the best one
when it is better by at least `min_delta`; then, with a `run`, best.keras and best.json are
written (`Run.save_best`). After `patience` evaluations in a row without one (0: never),
training stops with one line that says why, at which step, and where the best model is, and
the run's decoding.json names best.keras (translate, evaluate and export then decode with it).

The counters (`Record`) are saved in every checkpoint (`state()`), so a run that is stopped,
killed and resumed decides as one that ran in one piece. Only evaluations at the metric's
own steps count (multiples of `every`, and train_steps): a pass made elsewhere (at a time
limit) does not. A checkpoint is saved before the evaluation of its step (the periodic one), or
instead of it (on a signal, which skips the pass): a run resumed from it owes that evaluation
and makes it first (`catch_up`).
"""

import dataclasses

import keras
from tqdm import tqdm

# Whether a lower value is better, by metric (runs/sections.py declares the choice).
LOWER_IS_BETTER = {"loss": True, "bleu": False, "chrf": False}
# The key of each metric in its evaluator's results (`Validation`, `DevBleu`).
RESULT_KEYS = {"loss": "val_loss", "bleu": "bleu", "chrf": "chrf"}
STATE_KEY = "early_stopping"  # its entry in a checkpoint's state


@dataclasses.dataclass
class Record:
    """The counters, as saved in a checkpoint.

    Attributes:
        best: the best value so far (None before the first evaluation).
        best_step: the step of that evaluation.
        without_improvement: evaluations in a row since the best one.
        evaluated_step: the step of the latest evaluation counted (0: none yet).
        stopped_step: the step where the run stopped early (None: it has not).
    """

    best: float | None = None
    best_step: int | None = None
    without_improvement: int = 0
    evaluated_step: int = 0
    stopped_step: int | None = None

    @classmethod
    def from_state(cls, state):
        values = (state or {}).get(STATE_KEY) or {}
        return cls(**{field.name: values[field.name] for field in dataclasses.fields(cls)
                      if field.name in values})


class EarlyStopping(keras.callbacks.Callback):
    """Follows a dev metric; keeps the best model; stops after `patience` evaluations without
    an improvement.

    Put it after its evaluator (`Validation` or `DevBleu`) and before the `PeriodicCheckpoint`
    in the callbacks, so that a checkpoint saved at a step holds that step's decision.

    Args:
        evaluator: the `Validation` (metric loss) or `DevBleu` (bleu, chrf) callback, or None
            when there is no dev set (nothing is evaluated, nothing stops).
        metric: "loss", "bleu" or "chrf".
        patience: evaluations without an improvement before stopping (0: never stop).
        min_delta: the least change that counts as an improvement.
        every: the evaluator's interval in optimizer steps.
        train_steps: the run's last step (its evaluation counts too).
        step_fn: returns the current optimizer step.
        run: the `Run` (where best.keras is).
        keep: write best.keras, best.json and the decoding choice (the chief of a run with
            keep_best; False for a worker that is not the chief, or `--no-keep-best`).
        state: the training state of the checkpoint resumed from (`Checkpoint.state`), or
            None for a new run.
    """

    def __init__(self, evaluator, metric, patience, min_delta, every, train_steps, step_fn,
                 run, keep=True, state=None):
        super().__init__()
        self.evaluator, self.metric, self.patience = evaluator, metric, patience
        self.min_delta, self.every, self.train_steps = min_delta, every, train_steps
        self.step_fn, self.run, self.keep = step_fn, run, keep
        self.record = Record.from_state(state)
        self.reason = None  # why it stopped this run, in a few words

    @property
    def stopped(self):
        return self.record.stopped_step is not None

    def state(self):
        """The entry of a checkpoint's state: {"early_stopping": the record}."""
        return {STATE_KEY: dataclasses.asdict(self.record)}

    # Before training.
    def had_stopped(self, continue_stopped=False):
        """For a run that stopped early before (its checkpoint says so): the line to say and
        None to train on; with `continue_stopped`, the counters start again (the best is
        kept) and None."""
        record = self.record
        if record.stopped_step is None:
            return None
        if not continue_stopped:
            self.reason = f"had stopped early at step {record.stopped_step}"
            return (f"{self.run.directory} stopped early at step {record.stopped_step} (no "
                    f"improvement of dev {self.metric} in {record.without_improvement} "
                    f"evaluations; {self._best_text()}): it trains on to train_steps "
                    f"{self.train_steps} only with --continue-stopped.")
        _say(f"continuing a run that stopped early at step {record.stopped_step} "
             f"(--continue-stopped): patience counts again from this step")
        record.stopped_step, record.without_improvement = None, 0
        return None

    def catch_up(self, model):
        """Makes the evaluation owed by the checkpoint resumed from (one saved at an
        evaluation step before or instead of that evaluation). True when it stops the run."""
        self.set_model(model)
        step = self.step_fn()
        if self.evaluator is None or not self._counts(step):
            return False
        evaluator = self.evaluator
        evaluator.set_model(model)
        # The pass is early stopping's own: the evaluator's record (what TensorBoard logs and
        # the summary reads) stays as the process that saved the checkpoint left it.
        last, history = evaluator.last, list(getattr(evaluator, "history", ()))
        results = evaluator.evaluate()
        evaluator.last = last
        if hasattr(evaluator, "history"):
            evaluator.history[:] = history
        value = results[RESULT_KEYS[self.metric]]
        _say(f"step {step}: dev {self.metric} {value:.4f} (owed: the checkpoint resumed from "
             "was saved before this evaluation)")
        self._observe(step, results)
        return self.stopped

    # During training.
    def on_train_batch_end(self, batch, logs=None):
        self._follow()  # DevBleu evaluates after a batch

    def on_epoch_end(self, epoch, logs=None):
        self._follow()  # Validation evaluates at an epoch's end

    def _follow(self):
        if self.evaluator is None or self.stopped:
            return
        step, results = self.evaluator.last
        if step is not None and step == self.step_fn() and self._counts(step):
            self._observe(step, results)

    def _counts(self, step):
        """Whether an evaluation at `step` counts and has not been counted."""
        return (step > self.record.evaluated_step
                and (step % self.every == 0 or step == self.train_steps))

    def _observe(self, step, results):
        record = self.record
        value = float(results[RESULT_KEYS[self.metric]])
        record.evaluated_step = step
        change = (record.best - value if LOWER_IS_BETTER[self.metric] else
                  value - record.best) if record.best is not None else None
        if change is None or (change > 0 and change >= self.min_delta):
            record.best, record.best_step, record.without_improvement = value, step, 0
            if self.keep:
                self.run.save_best(self.model, step, self.metric, value)
            return
        record.without_improvement += 1
        if self.patience and record.without_improvement >= self.patience:
            self._stop(step)

    def _stop(self, step):
        record = self.record
        record.stopped_step = step
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
             f"{self.min_delta:g} in {record.without_improvement} evaluations; "
             f"{self._best_text()}")

    def _best_text(self):
        record = self.record
        text = f"the best, {self.metric} {record.best:.4f} at step {record.best_step}"
        if self.keep:
            return f"{text}, is {self.run.best_path}"
        return f"{text}, was not kept (keep_best is off here)"


def _say(line):
    """Prints a line without breaking an active progress bar."""
    tqdm.write(line)
