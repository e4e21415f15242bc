"""What a training run's callbacks tell each other and the trainer: the dev evaluations,
published once each to one owner, how training ended (`Outcome`), and the order the callbacks
run in, from what each declares it needs and gives.

    evaluations = Evaluations("loss", min_delta=0.0, every=500, train_steps=20000)
    evaluations.restore(checkpoint_state)                         # the counters saved
    outcome = Outcome()
    validation = Validation(DevLoss(dev, loss), step_fn, evaluations)  # publishes
    early = EarlyStopping(evaluations, patience=4, outcome=outcome, ...)  # listens
    evaluations.catch_up(step, lambda: dev_loss(model))           # the owed evaluation, if any
    model.fit(..., callbacks=in_order([checkpoint, early, validation, user_callback]))
    outcome.reason                                                # why training stopped

A callback never holds another callback: a producer (`Validation`, `DevBleu`) publishes an
`Evaluation` to the run's `Evaluations`, which judges it against the best one so far (the
early-stopping counters are its own, saved in every checkpoint through `state()`) and hands it
to its listeners (`EarlyStopping`, `BestModel`), in the producer's hook; `TensorBoardLog` reads
the history. The producers also put their figures in Keras' `logs` (val_loss, val_bleu, ...),
where a caller's callbacks read them. The trainer reads no callback: what it needs after `fit`
is in the `Evaluations` and the `Outcome`. The callbacks' order in `model.fit` is Keras' list,
sorted here once: each of our callbacks declares the topics it `needs` (runs after every
callback that gives them) and `gives`; a callback without declarations (a user's) depends on
nothing, and independent callbacks keep the order they were given in (tests/test_events.py
shuffles them).
"""

import dataclasses

# Topics. Each is given by the callbacks named and needed by those that must run after them in
# the same hook (at the end of a batch, mostly).
LOSS_CHECKED = "loss checked"  # NanGuard: the batch's loss is finite (no NaN weights saved)
EVALUATED = "evaluated"  # Validation, DevBleu: this hook's evaluations are published and judged
CHECKPOINTED = "checkpointed"  # PeriodicCheckpoint: the batch is counted, any periodic save done

# Whether a lower value is better, by metric (runs/sections.py declares the choice).
LOWER_IS_BETTER = {"loss": True, "bleu": False, "chrf": False}
# The key of each metric among an evaluation's figures, and the kind of evaluation it is in.
RESULT_KEYS = {"loss": "val_loss", "bleu": "bleu", "chrf": "chrf"}
KINDS = {"loss": "loss", "bleu": "translation", "chrf": "translation"}
STATE_KEY = "early_stopping"  # the counters' entry in a checkpoint's state


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """What one dev evaluation found.

    Attributes:
        step: the optimizer step it was made at.
        kind: "loss" (`Validation`: val_loss, val_perplexity, val_token_accuracy) or
            "translation" (`DevBleu`: bleu, chrf).
        figures: {key: value}; a run of several pairs has the means under those keys and each
            pair's figures under "PAIR/KEY" ("en-fr/bleu").
        counted: an evaluation of the followed metric at its own steps (multiples of `every`,
            and train_steps), not counted before: the early-stopping counters moved.
        improved: counted, and better than the best before by at least min_delta.
        owed: made by a resumed run for the checkpoint it resumed from (saved before or instead
            of this evaluation): judged, but not part of this process's history.
    """

    step: int
    kind: str
    figures: dict
    counted: bool = False
    improved: bool = False
    owed: bool = False


@dataclasses.dataclass
class Record:
    """The early-stopping counters, as saved in a checkpoint.

    Attributes:
        best: the best value so far (None before the first evaluation).
        best_step: the step of that evaluation.
        without_improvement: evaluations in a row since the best one.
        evaluated_step: the step of the latest evaluation counted (0: none yet).
        stopped_step: the step where the run stopped early (None: it has not).
        stopped_by: None when the run's early stopping stopped it; "a callback" when a callback
            of the caller's did (Keras' EarlyStopping on val_bleu, say).
    """

    best: float | None = None
    best_step: int | None = None
    without_improvement: int = 0
    evaluated_step: int = 0
    stopped_step: int | None = None
    stopped_by: str | None = None

    @classmethod
    def from_state(cls, state):
        values = (state or {}).get(STATE_KEY) or {}
        return cls(**{field.name: values[field.name] for field in dataclasses.fields(cls)
                      if field.name in values})


class Evaluations:
    """The one owner of what the run's dev evaluations found: the history of this process,
    the followed metric's counters (`Record`, saved with every checkpoint) and the listeners.

    Args:
        metric: the followed metric: "loss", "bleu" or "chrf".
        min_delta: the least change that counts as an improvement.
        every: the interval in optimizer steps of the evaluations of that metric.
        train_steps: the run's last step (its evaluation counts too).
    """

    def __init__(self, metric="loss", min_delta=0.0, every=1, train_steps=None):
        self.metric, self.min_delta, self.every = metric, min_delta, every
        self.train_steps = train_steps
        self.record = Record()
        self.history = []  # the Evaluations published by this process, owed ones left out
        self.closed = False  # True: no more passes in this process (a checkpoint on a signal)
        self._listeners = []

    def restore(self, state):
        """Takes the counters of a checkpoint's training state (None: a new run's)."""
        self.record = Record.from_state(state)

    def state(self):
        """The entry of a checkpoint's training state: {"early_stopping": the counters}
        (`stopped_by` only when a callback of the caller's stopped the run)."""
        counters = dataclasses.asdict(self.record)
        if counters["stopped_by"] is None:
            del counters["stopped_by"]
        return {STATE_KEY: counters}

    def listen(self, listener):
        """Calls `listener(evaluation)` for every evaluation published from now on."""
        self._listeners.append(listener)

    def close(self):
        """No more evaluation passes in this process: the grace period of a signal is short."""
        self.closed = True

    @property
    def stopped(self):
        return self.record.stopped_step is not None

    def stop(self, step, by=None):
        """Notes that the run stopped early at `step` (saved with the next checkpoint); `by`:
        `Record.stopped_by`."""
        self.record.stopped_step, self.record.stopped_by = step, by

    def owes(self, step):
        """Whether an evaluation of the followed metric at `step` counts and is not counted
        yet (the checkpoint resumed from was saved before or instead of it)."""
        return (not self.stopped and step > self.record.evaluated_step
                and (step % self.every == 0 or step == self.train_steps))

    def catch_up(self, step, evaluate):
        """Makes the evaluation owed at `step`, the step a run resumes from, if it owes one.

        The periodic checkpoint of an evaluation step is saved at the end of its last batch,
        before the dev pass at the end of the Keras epoch; a checkpoint on a signal skips the
        pass. A run resumed from such a checkpoint makes that evaluation first, before `fit`:
        `evaluate()` returns the followed metric's figures (its kind's: the dev loss pass or
        the greedy dev translation), published as owed (judged, left out of the history). True
        when it stopped the run."""
        if not self.owes(step):
            return False
        self.publish(KINDS[self.metric], step, evaluate(), owed=True)
        return self.stopped

    def latest(self, kind, step):
        """The figures of this process's evaluation of `kind` at `step`, or None."""
        found = [e for e in self.history if e.kind == kind and e.step == step]
        return found[-1].figures if found else None

    def value(self, evaluation):
        """The followed metric's value in `evaluation`."""
        return float(evaluation.figures[RESULT_KEYS[self.metric]])

    def publish(self, kind, step, figures, owed=False):
        """Judges an evaluation, keeps it (unless owed) and hands it to the listeners;
        returns the `Evaluation`."""
        counted = kind == KINDS[self.metric] and self.owes(step)
        improved = counted and self._judge(step, float(figures[RESULT_KEYS[self.metric]]))
        evaluation = Evaluation(step, kind, dict(figures), counted, improved, owed)
        if not owed:
            self.history.append(evaluation)
        for listener in self._listeners:
            listener(evaluation)
        return evaluation

    def _judge(self, step, value):
        """Moves the counters; True when `value` improves on the best."""
        record = self.record
        record.evaluated_step = step
        change = (record.best - value if LOWER_IS_BETTER[self.metric] else
                  value - record.best) if record.best is not None else None
        if change is None or (change > 0 and change >= self.min_delta):
            record.best, record.best_step, record.without_improvement = value, step, 0
            return True
        record.without_improvement += 1
        return False


class Outcome:
    """How training ended, written by the callbacks that end it and read by the trainer after
    `fit` (a callback's own attributes are its own: the trainer reads none).

    Attributes:
        reason: why training stopped, in a few words (None: Keras' epochs ran out).
        early: the stop was an early stop (the run's, on dev, or a caller's callback's).
        preempted: the `Preempted` error of a checkpoint saved on a signal, else None.
        first_batch_end: time.monotonic() when the first batch ended (under XLA, after its
            compilation), else None.
    """

    def __init__(self):
        self.reason, self.early = None, False
        self.preempted = self.first_batch_end = None

    def stop(self, reason, early=False):
        """Notes why training stops. The first reason stays, except that an early stop wins
        over a limit reached in the same step (train_steps, the time limit)."""
        if self.reason is None or (early and not self.early):
            self.reason, self.early = reason, early

    def batch_ended(self, now):
        if self.first_batch_end is None:
            self.first_batch_end = now


def in_order(callbacks):
    """`callbacks` sorted so that each runs after every callback that gives a topic it
    `needs`; independent callbacks (a user's, without declarations) keep their order. A
    need that nothing gives (no dev set: nothing evaluates) is no constraint; None (a callback
    the run has not) is left out."""
    pending = [callback for callback in callbacks if callback is not None]
    givers = {}
    for callback in pending:
        for topic in getattr(callback, "gives", ()):
            givers.setdefault(topic, []).append(callback)
    ordered, placed = [], set()
    while pending:
        ready = next((c for c in pending if all(
            id(g) in placed or g is c for topic in getattr(c, "needs", ())
            for g in givers.get(topic, ()))), None)
        if ready is None:
            names = ", ".join(type(c).__name__ for c in pending)
            raise ValueError(f"callbacks that need each other's topics: {names}")
        ordered.append(ready)
        placed.add(id(ready))
        pending.remove(ready)
    return ordered
