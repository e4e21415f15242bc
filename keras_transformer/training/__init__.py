"""Training: the paper's loss, schedule and optimizer, the callbacks, and `train()`.

    loss.py        label-smoothed cross-entropy (Section 5.4)
    schedule.py    the paper's learning rate (Section 5.3); warmup, then a decay to 0
    optimizer.py   Adam with the paper's betas, fused; clipping, a moving average
    metrics.py     masked token accuracy and perplexity
    events.py      the dev evaluations' one owner, how training ended (`Outcome`), and the
                   callbacks' order from their needs
    checkpointer.py  the run's checkpoints' one owner (periodic saves, the signal handler)
    callbacks.py   checkpoints, dev evaluation, stopping, NaN guard
    early_stopping.py  early stopping and best.keras, listening to the evaluations
    strategy.py    tf.distribute strategies
    trainer.py     train(config): a run from its config to model.keras
"""

from keras_transformer.training.loss import LabelSmoothedCrossEntropy  # noqa: F401
from keras_transformer.training.schedule import TransformerSchedule  # noqa: F401

# The training loop and its callbacks load when first used: importing the loss (as the
# package does) must not load the trainer's data pipelines and their TensorFlow.
_LAZY = {"NanGuard": "callbacks", "TrainingError": "callbacks", "compile_model": "trainer",
         "train": "trainer"}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
