"""How a training run starts: new, resumed from its own checkpoints, or fine-tuned from a
parent run's weights (`train --init-from`, runs/parent.py). Decided once, before training, by
one object that the trainer then asks for the config, the vocabulary to adopt and the initial
weights; the trainer itself has no branch on how the run started.

    start = RunStart.decide(requested)          # no TensorFlow: reads files only
    start.run, start.config                     # the run and the config it trains with
    print(start.describe())                     # "resuming ..." and the effective config
    training_data(start.run, start.config, chief, adopt=start.vocabulary)
    origin = start.initial_weights(model, per_step, dev_loss)  # built and compiled
    origin.step, origin.data_position, origin.state, origin.start_figures, origin.summary()

The decision: a run with a checkpoint that reads resumes from it (a fine-tuned run then never
reads its parent again); otherwise a run with `init_from` starts from its parent's weights
(checked when decided: `parent.start_child`, the one call into runs/parent.py) and takes the
parent's vocabulary before its data are prepared; otherwise it starts from the weights its
model was built with (the seed's).
"""

import dataclasses
import typing

from keras_transformer.runs import parent
from keras_transformer.runs.checkpoints import Checkpoint
from keras_transformer.runs.run import Run

NEW, RESUMED, FINE_TUNED = "new", "resumed", "fine-tuned"


@dataclasses.dataclass(frozen=True)
class Origin:
    """Where the weights of a run that starts training now came from.

    Attributes:
        kind: NEW, RESUMED or FINE_TUNED.
        step: the optimizer step it starts at.
        data_position: the training batches the input pipeline handed over before this
            start (saved with the checkpoint; 0 for a run that starts at step 0).
        checkpoint: the `Checkpoint` resumed from (RESUMED), else None.
        parent_model: the parent's model file (FINE_TUNED), else None.
        start_figures: the dev figures of the parent's weights (FINE_TUNED with a dev set:
            val_loss, val_perplexity, val_token_accuracy), else None.
    """

    kind: str
    step: int
    data_position: int = 0
    checkpoint: typing.Optional[Checkpoint] = None
    parent_model: typing.Optional[str] = None
    start_figures: typing.Optional[dict] = None

    @property
    def state(self):
        """The training state saved with the checkpoint resumed from ({} when none)."""
        return self.checkpoint.state if self.checkpoint else {}

    def summary(self):
        """What the training summary records of the start."""
        if self.start_figures is None:
            return {}
        return {"start_val_loss": float(self.start_figures["val_loss"])}


class RunStart:
    """The decision of how a run starts (`decide`), and the start itself.

    Attributes:
        run: the `Run`.
        config: the config it trains with (a new run's, or the saved one continued).
        vocabulary: (sentencepiece model path, record) that the run takes as its vocabulary
            before its data are prepared (a fine-tuned run's parent's), or None.
    """

    def __init__(self, run, config, resuming, parent_start):
        self.run, self.config, self.resuming = run, config, resuming
        self._parent = parent_start
        self.vocabulary = (None if parent_start is None else
                           (parent_start.vocabulary, parent_start.vocabulary_record))

    @classmethod
    def decide(cls, requested):
        """How the run of `requested` (a config, not resolved) starts. ConfigError or RunError
        say what is wrong (a parent that is gone or changed, settings a resumed run cannot
        change)."""
        run = Run(requested.output_dir)
        config, parent_start = parent.start_child(requested, resumes=run.has_checkpoint)
        resuming = run.is_run()
        return cls(run, run.config_for(config), resuming, parent_start)

    def describe(self):
        """The lines a run prints before training: whether it resumes with its saved settings
        (and which the command changed), then the effective config."""
        lines = []
        if self.resuming:
            changed = self.config.sources
            lines.append(f"resuming {self.run.directory} with its saved settings"
                         + (f" (changed: {', '.join(sorted(changed))})" if changed else ""))
        return "\n".join(lines + [self.config.describe()])

    def initial_weights(self, model, per_step, dev_loss=None):
        """Gives `model` (built and compiled) the weights it starts from: the newest readable
        checkpoint's (weights, optimizer state, random state, data position; a checkpoint
        without a data position: `per_step` batches a step), else the parent's, else leaves
        those it was built with. Prints where they came from; a fine-tuned run's first dev loss
        too, with `dev_loss` (the dev pass, called with the model: `training.callbacks.DevLoss`;
        None without a dev set). No callback is driven here: the trainer publishes those
        figures once the run's counters are restored.

        Returns:
            the `Origin`.
        """
        restored = self.run.restore(model)
        if restored:
            # The data position (batches each input pipeline has handed over) is saved with
            # every checkpoint: a resumed run reads on from exactly there.
            position = (restored.step * per_step if restored.data_position is None
                        else restored.data_position)
            print(f"resumed from {restored.path} at step {restored.step}, training batch "
                  f"{position}", flush=True)
            return Origin(RESUMED, restored.step, position, checkpoint=restored)
        if self._parent is None:
            return Origin(NEW, 0)
        path = self._parent.run.assign_weights(model, self._parent.model)
        print(f"fine-tuning: starting from the weights of {path}", flush=True)
        figures = None
        if dev_loss is not None:  # the figure fine-tuning has to lower
            figures = dev_loss(model)
            print(f"fine-tuning: dev loss {float(figures['val_loss']):.3f} with the parent's "
                  "weights", flush=True)
        return Origin(FINE_TUNED, 0, parent_model=str(path), start_figures=figures)
