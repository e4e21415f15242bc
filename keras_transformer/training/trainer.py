"""Training with `model.fit`: the paper's recipe (Section 5) plus checkpoints, resume and
tf.distribute.

    from keras_transformer.runs import make_config
    from keras_transformer.training import train
    train(make_config(preset="small", dataset="multi30k", train_steps=20000))

The same runs from the shell: `keras-transformer train --preset small --train-steps 20000`.
Restarting a killed run with the same command resumes from its last checkpoint: weights,
optimizer state, step and data position. The training pairs are prepared once (tokenized into
shards, `pipelines.prepared`) and read from the data cache by every run on the same corpus; the
data position is a batch number of a deterministic stream, so a resumed run sees exactly the
batches an uninterrupted one would have, without replaying those before.
"""

import contextlib
import logging
import math
import re
import time

import keras

from keras_transformer import hardware
from keras_transformer.runs.start import RunStart
from keras_transformer.training.checkpointer import Checkpointer
from keras_transformer.training.callbacks import (DevBleu, NanGuard, PeriodicCheckpoint,
                                                  Progress, StopAt, TrainingError, Validation)
from keras_transformer.training.early_stopping import (BestModel, CallbackStop, EarlyStopping,
                                                       stopped_before)
from keras_transformer.training.events import KINDS, Evaluations, Outcome, in_order
from keras_transformer.training.inputs import (TokenCounter, batches_per_step, check_data,
                                               dev_data, dev_passes, on_tensorflow,
                                               train_batches, training_data)
from keras_transformer.training.loss import LabelSmoothedCrossEntropy
from keras_transformer.training.optimizer import averaged_weights, run_optimizer
from keras_transformer.training.preemption import CheckpointOnSignal
from keras_transformer.training.strategy import is_chief, make_strategy, task_id
from keras_transformer.training.tensorboard import TensorBoardLog
from pipelines.errors import DataError
from pipelines.prepared import describe

log = logging.getLogger(__name__)


def compile_model(model, config):
    """Compiles with the paper's optimizer and loss; returns (optimizer, loss).

    No training metrics: token accuracy and perplexity each take another pass over the
    (B, T, V) logits (an argmax, a second softmax), which cost about a tenth of a d_model-128
    training step with a 10k vocabulary. The loss is logged each step; the `Validation`
    callback reports dev perplexity and token accuracy every eval_steps."""
    optimizer = run_optimizer(model.d_model, config.optimization)
    loss = LabelSmoothedCrossEntropy(config.label_smoothing)
    # JAX runs every step through XLA (eager JAX is op by op); TensorFlow when asked (--xla).
    model.compile(optimizer=optimizer, loss=loss, jit_compile=config.xla or not on_tensorflow())
    # Under mixed_float16 Keras wraps the optimizer in a LossScaleOptimizer: use the wrapper,
    # so checkpoints hold the loss scale too.
    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)
    return optimizer, loss


def train(config, continue_stopped=False, callbacks=()):
    """Runs (or resumes) training as configured. Returns a summary dict.

    A run that stopped early (training/early_stopping.py) trains on only with
    `continue_stopped` (`train --continue-stopped`). `callbacks`: Keras callbacks of the
    caller's own, run by `model.fit` after the run's (training/events.py orders them). The Keras
    dtype policy is the config's while training, and the process's own again after.

    The dev figures are in the Keras `logs` that those callbacks get: val_loss,
    val_perplexity and val_token_accuracy at the end of every Keras epoch (eval_steps optimizer
    steps), val_bleu and val_chrf (with bleu_steps) in the logs of the batch they are computed
    at and of the end of that epoch. So Keras' own callbacks work on them:

        train(config, callbacks=[
            keras.callbacks.CSVLogger("dev.csv"),
            keras.callbacks.EarlyStopping(monitor="val_bleu", mode="max", patience=3)])

    A stop that such a callback asks for is the run's early stop: the summary's "stopped"
    says so, and running `train` again trains on only with `continue_stopped`."""
    previous = keras.mixed_precision.global_policy()
    try:
        with contextlib.ExitStack() as held:
            return _train(config, held, continue_stopped, list(callbacks))
    finally:
        keras.mixed_precision.set_global_policy(previous)


def _train(requested, held, continue_stopped, user_callbacks):
    # How the run starts (new, resumed, or from a parent's weights) is decided here, once.
    start = RunStart.decide(requested)
    run, config = start.run, start.config
    strategy, chief = _open(start, held)
    data, vocabulary = training_data(run, config, chief, adopt=start.vocabulary)
    if chief:
        print(describe(data), flush=True)
    dev, dev_texts = dev_data(config, run)

    # Model, optimizer, dev passes; the initial weights: the newest readable checkpoint's
    # (with its early-stopping counters), else the parent's, else the seed's.
    keras.utils.set_random_seed(config.seed)
    with strategy.scope():
        model = run.build_model()
        optimizer, loss = compile_model(model, config)
    step_fn = _step_counter(model, optimizer)
    passes = dev_passes(config, dev, dev_texts, loss, vocabulary)
    per_step = batches_per_step(config, strategy)
    # Every worker starts from the run's checkpoints; only the chief's saves are the run's.
    origin = start.initial_weights(model, per_step, passes.get("loss"))
    evaluations = _evaluations(config, origin, has_dev=bool(passes))
    start_step = step_fn()
    summary = {"run_dir": str(run.directory), "start_step": start_step, "step": start_step}
    if start_step >= config.train_steps:
        print(f"nothing to do: step {start_step} >= train_steps {config.train_steps}")
        return {"step": start_step, "run_dir": str(run.directory)}
    had_stopped = stopped_before(evaluations, run, continue_stopped, _keeps_best(config, chief,
                                                                                passes))
    if had_stopped:
        print(had_stopped, flush=True)
        return dict(summary, stopped=f"had stopped early at step "
                                     f"{evaluations.record.stopped_step}")

    counter, outcome = TokenCounter(), Outcome()
    train_data = train_batches(data, config, strategy, origin.data_position, counter)
    checkpointer = _checkpointer(run, config, strategy, per_step, origin.data_position,
                                 step_fn, evaluations)
    on_signal = _on_signal(config, checkpointer, step_fn, evaluations, outcome)
    callbacks = _callbacks(run, config, chief, step_fn, passes, evaluations, outcome,
                           checkpointer, on_signal, counter, user_callbacks)
    started = time.monotonic()
    with _fitting(on_signal):
        for callback in callbacks:
            callback.set_model(model)
        owed = _owed_pass(passes, evaluations, model, start_step)
        if owed and evaluations.catch_up(start_step, owed):
            checkpointer.save(model, "early stopping")  # the owed evaluation stopped the run
        else:
            _fit(model, train_data, config, start_step, callbacks, chief)
    seconds = time.monotonic() - started

    step = step_fn()
    if outcome.preempted and step < config.train_steps and not evaluations.stopped:
        raise outcome.preempted  # at train_steps, or stopped early, the run finishes as usual
    summary.update(step=step, **_speed(seconds, counter.count()),
                   stopped=outcome.reason or "epochs done")
    if outcome.first_batch_end is not None:  # the first step, its compilation included
        summary["first_step_seconds"] = round(outcome.first_batch_end - started, 2)
    summary.update(origin.summary())
    if "loss" in passes:  # the pass at the last epoch's end, if made at this step
        summary.update(evaluations.latest("loss", step) or passes["loss"](model))
    return _finish(summary, run, config, model, chief)


def _open(start, held):
    """Checks the run's text files, sets the precision, makes the strategy, takes the run's
    lock (on the chief) and says how the run starts. Returns (strategy, chief)."""
    config = start.config
    check_data(config)  # empty text files are refused before anything is written
    keras.mixed_precision.set_global_policy(config.precision)
    strategy = make_strategy(config.strategy, config.num_replicas)
    chief = is_chief(strategy)
    if chief:  # one writer per run: a second `train` (or `average`, `export`) is refused
        held.enter_context(start.run.lock("training", create=True))
    print(start.describe(), flush=True)
    if on_tensorflow():
        print(hardware.kernel_summary(), flush=True)
    if chief:
        start.run.save_config(config)
    return strategy, chief


def _evaluations(config, origin, has_dev):
    """The run's `Evaluations`, with the counters of the checkpoint resumed from: the followed
    metric's evaluations are judged against the best (every eval_steps for the dev loss,
    bleu_steps for BLEU and chrF). A fine-tuned run's dev figures with its parent's weights are
    its first evaluation (TensorBoard's first dev point)."""
    if config.early_stopping_patience and not has_dev:
        raise TrainingError(f"early_stopping_patience {config.early_stopping_patience} needs a "
                            f"dev set, and dataset {config.dataset!r} has none here: give "
                            "--dev-src and --dev-tgt, or leave early stopping off.")
    loss = config.early_stopping_metric == "loss"
    evaluations = Evaluations(config.early_stopping_metric, config.early_stopping_min_delta,
                              config.eval_steps if loss else config.bleu_steps,
                              config.train_steps)
    evaluations.restore(origin.state)
    if origin.start_figures is not None:
        evaluations.publish("loss", origin.step, origin.start_figures)
    return evaluations


def _keeps_best(config, chief, passes):
    """Whether this process writes best.keras: the chief of a run with keep_best (by default,
    a run with a dev set)."""
    keep_best = config.keep_best if config.keep_best is not None else bool(passes)
    return chief and keep_best


def _callbacks(run, config, chief, step_fn, passes, evaluations, outcome, checkpointer,
               on_signal, counter, user_callbacks):
    """The run's callbacks and the caller's, in the order their declared needs give
    (training/events.py), and last `CallbackStop`, which records a stop that a caller's
    callback asked for."""
    validation = dev_bleu = early = best = None
    if passes:
        validation = Validation(passes["loss"], step_fn, evaluations)
        keep = _keeps_best(config, chief, passes)
        early = EarlyStopping(evaluations, config.early_stopping_patience, run, keep=keep,
                              outcome=outcome)
        best = BestModel(evaluations, run) if keep else None
    if "translation" in passes:
        dev_bleu = DevBleu(passes["translation"], config.bleu_steps, step_fn, evaluations)
    stop = StopAt(config.train_steps, step_fn, config.time_limit_minutes, outcome)
    return in_order([NanGuard(step_fn), validation, dev_bleu, early, best, stop,
                     _periodic(config, checkpointer), on_signal,
                     *_logs(run, config, chief, step_fn, counter, evaluations),
                     *user_callbacks]) + [CallbackStop(evaluations, outcome, step_fn)]


def _owed_pass(passes, evaluations, model, step):
    """The pass of the followed metric that `Evaluations.catch_up` makes when the run owes it:
    its figures (the greedy dev translation's line printed as `DevBleu` prints it). None
    without that pass (no dev set)."""
    kind = KINDS[evaluations.metric]
    if kind not in passes:
        return None

    def evaluate():
        figures = passes[kind](model)
        if kind == "translation":
            figures, line = figures
            print(f"step {step}: {line}", flush=True)
        return figures

    return evaluate


def _checkpointer(run, config, strategy, per_step, position, step_fn, evaluations):
    """The run's `Checkpointer`: the chief saves the run's checkpoints, another worker its own
    (one kept); each holds the data position and the early-stopping counters."""
    chief = is_chief(strategy)
    return Checkpointer(
        run, step_fn, keep=config.keep_checkpoints if chief else 1,
        data_position=lambda batches: position + batches * per_step // config.grad_accum_steps,
        directory=None if chief else run.worker_checkpoint_dir(task_id(strategy)),
        state=evaluations.state)


def _periodic(config, checkpointer):
    """The `PeriodicCheckpoint`: every checkpoint_minutes and/or checkpoint_steps; under
    multiworker by steps only (default eval_steps), the workers saving at the same step."""
    multiworker = config.strategy == "multiworker"
    minutes = None if multiworker else config.checkpoint_minutes
    steps = config.checkpoint_steps or (config.eval_steps if multiworker else None)
    return PeriodicCheckpoint(checkpointer, minutes, steps)


def _on_signal(config, checkpointer, step_fn, evaluations, outcome):
    """On SIGTERM/SIGINT: finish the step, checkpoint, stop (not under multiworker: see
    training/preemption.py)."""
    if not config.checkpoint_on_signal or config.strategy == "multiworker":
        return None
    return CheckpointOnSignal(checkpointer, step_fn, evaluations, outcome)


def _logs(run, config, chief, step_fn, counter, evaluations):
    """What the chief writes and shows: the TensorBoard events (training/tensorboard.py) and,
    with verbose >= 1, the progress bar over the run's steps (not Keras' epochs)."""
    if not chief:
        return []
    logs = [TensorBoardLog(run.logs_dir, step_fn, config.log_steps, counter.count,
                           config.describe(), evaluations,
                           read_loss_tracker=config.strategy != "multiworker")]
    if config.verbose >= 1:
        logs.append(Progress(step_fn, config.train_steps, counter.count))
    return logs


def _fit(model, train_data, config, start_step, callbacks, chief):
    """`model.fit` over the run's steps. A Keras epoch is eval_steps optimizer steps, i.e.
    eval_steps x grad_accum_steps batches."""
    epochs = math.ceil(config.train_steps / config.eval_steps)
    model.fit(train_data, epochs=epochs,
              steps_per_epoch=config.eval_steps * config.grad_accum_steps, shuffle=False,
              initial_epoch=min(start_step // config.eval_steps, epochs - 1),
              callbacks=callbacks, verbose=2 if chief and config.verbose >= 2 else 0)


@contextlib.contextmanager
def _fitting(on_signal):
    """Around `fit`: a shard damaged while training ran reaches fit (tf.data) as an op error
    around our message, raised again as the DataError; the signal handlers go back (fit skips
    on_train_end when it raises)."""
    try:
        yield
    except Exception as error:
        damaged = re.search(r"pipelines\.errors\.DataError: (.*)", str(error))
        if damaged and not isinstance(error, DataError):
            raise DataError(damaged.group(1)) from None
        raise
    finally:
        if on_signal:
            on_signal.restore_handlers()


def _speed(seconds, tokens):
    return {"seconds": round(seconds, 1), "tokens": tokens,
            "tokens_per_s": round(tokens / max(seconds, 1e-9), 1)}


def _finish(summary, run, config, model, chief):
    """The summary with the saved model; prints it."""
    if chief:
        with averaged_weights(model):  # the moving average's, where the run keeps one
            summary["model"] = str(run.save_model(model))
    summary["backend"] = keras.backend.backend()
    summary["precision"] = config.precision
    print(f"training done: step {summary['start_step']} -> {summary['step']} in "
          f"{summary['seconds']:.0f} s "
          f"({summary['tokens_per_s']:.0f} tokens/s, source + target), {summary['stopped']}"
          + (f"; dev loss {summary['val_loss']:.3f}, perplexity {summary['val_perplexity']:.2f}"
             if "val_loss" in summary else ""), flush=True)
    return summary


def _step_counter(model, optimizer):
    """A function returning the current optimizer step. On JAX, `fit` keeps the variables'
    new values to itself between epochs: the step is read from that state (no device sync of
    the weights)."""
    if on_tensorflow():
        return lambda: int(optimizer.iterations.numpy())

    # Where the step counter sits among the optimizer's variables (found once: several
    # callbacks ask for the step after every batch). With gradient accumulation `iterations`
    # is computed (batches // accumulation steps) from the `_iterations` variable.
    counter = getattr(optimizer, "_iterations", optimizer.iterations)
    accumulation = optimizer.gradient_accumulation_steps or 1
    paths = [v.path for v in optimizer.variables]
    index = paths.index(counter.path) if counter.path in paths else None

    def step():
        state = getattr(model, "_jax_state", None)
        if index is not None and state and state.get("optimizer_variables"):
            return int(state["optimizer_variables"][index]) // accumulation
        return int(keras.ops.convert_to_numpy(optimizer.iterations))

    return step
