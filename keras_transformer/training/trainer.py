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
from keras_transformer.training.callbacks import (DevBleu, NanGuard, PeriodicCheckpoint,
                                                  Progress, StopAt, TrainingError, Validation)
from keras_transformer.training.early_stopping import EarlyStopping
from keras_transformer.training.inputs import (TokenCounter, batches_per_step, check_data,
                                               dev_callbacks, dev_data, on_tensorflow,
                                               train_batches, training_data)
from keras_transformer.training.loss import LabelSmoothedCrossEntropy
from keras_transformer.training.optimizer import paper_optimizer
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
    optimizer = paper_optimizer(model.d_model, config.warmup_steps, config.lr_scale,
                                config.grad_accum_steps)
    loss = LabelSmoothedCrossEntropy(config.label_smoothing)
    # JAX runs every step through XLA (eager JAX is op by op); TensorFlow when asked (--xla).
    model.compile(optimizer=optimizer, loss=loss, jit_compile=config.xla or not on_tensorflow())
    # Under mixed_float16 Keras wraps the optimizer in a LossScaleOptimizer: use the wrapper,
    # so checkpoints hold the loss scale too.
    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)
    return optimizer, loss


def train(config, continue_stopped=False):
    """Runs (or resumes) training as configured. Returns a summary dict.

    A run that stopped early (training/early_stopping.py) trains on only with
    `continue_stopped` (`train --continue-stopped`). The Keras dtype policy is the config's
    while training, and the process's own again after."""
    previous = keras.mixed_precision.global_policy()
    try:
        with contextlib.ExitStack() as held:
            return _train(config, held, continue_stopped)
    finally:
        keras.mixed_precision.set_global_policy(previous)


def _train(requested, held, continue_stopped):
    # How the run starts (new, resumed, or from a parent's weights) is decided here, once.
    start = RunStart.decide(requested)
    run, config = start.run, start.config
    check_data(config)  # empty text files are refused before anything is written
    keras.mixed_precision.set_global_policy(config.precision)
    strategy = make_strategy(config.strategy, config.num_replicas)
    chief = is_chief(strategy)
    if chief:  # one writer per run: a second `train` (or `average`, `export`) is refused
        held.enter_context(run.lock("training", create=True))
    print(start.describe(), flush=True)
    if on_tensorflow():
        print(hardware.kernel_summary(), flush=True)
    if chief:
        run.save_config(config)

    # Data and vocabulary: the training pairs come prepared (tokenized, sharded) from the cache.
    data, vocabulary = training_data(run, config, chief, adopt=start.vocabulary)
    if chief:
        print(describe(data), flush=True)
    dev, dev_texts = dev_data(config, run)

    # Model, optimizer, dev evaluation; the initial weights: the newest readable checkpoint's,
    # else the parent's, else the seed's.
    keras.utils.set_random_seed(config.seed)
    with strategy.scope():
        model = run.build_model()
        optimizer, loss = compile_model(model, config)
    step_fn = _step_counter(model, optimizer)
    validation = dev_bleu = None
    if dev is not None:  # several pairs: each pair's figures and their mean
        validation, dev_bleu = dev_callbacks(config, dev, dev_texts, loss, step_fn, vocabulary)
    per_step = batches_per_step(config, strategy)
    # Every worker starts from the run's checkpoints; only the chief's saves are the run's.
    origin = start.initial_weights(model, per_step, validation)
    start_step, position = step_fn(), origin.data_position
    early = _early_stopping(config, run, validation, dev_bleu, step_fn, chief, origin.state)
    summary = {"run_dir": str(run.directory), "start_step": start_step, "step": start_step}
    if start_step >= config.train_steps:
        print(f"nothing to do: step {start_step} >= train_steps {config.train_steps}")
        return {"step": start_step, "run_dir": str(run.directory)}
    had_stopped = early.had_stopped(continue_stopped)
    if had_stopped:
        print(had_stopped, flush=True)
        return dict(summary, stopped=early.reason)
    counter = TokenCounter()
    train_data = train_batches(data, config, strategy, position, counter)

    callbacks = [NanGuard(step_fn)] + [c for c in (validation, dev_bleu) if c is not None]
    callbacks.append(early)  # after its evaluator, before the checkpoint that saves its counters
    stop = StopAt(config.train_steps, step_fn, config.time_limit_minutes)
    multiworker = config.strategy == "multiworker"
    checkpoint_minutes = None if multiworker else config.checkpoint_minutes
    checkpoint_steps = config.checkpoint_steps or (config.eval_steps if multiworker else None)
    checkpoint = PeriodicCheckpoint(
        run, step_fn, checkpoint_minutes, checkpoint_steps,
        keep=config.keep_checkpoints if chief else 1,
        data_position=lambda batches: position + batches * per_step // config.grad_accum_steps,
        directory=None if chief else run.worker_checkpoint_dir(task_id(strategy)),
        state=early.state)
    callbacks += [checkpoint, stop]
    # On SIGTERM/SIGINT: finish the step, checkpoint, stop (not under multiworker: see
    # training/preemption.py).
    on_signal = (CheckpointOnSignal(checkpoint, step_fn, validation)
                 if config.checkpoint_on_signal and not multiworker else None)
    if on_signal:
        callbacks.append(on_signal)
    if chief:  # after Validation and DevBleu: it writes their figures
        callbacks.append(tensorboard_log(run, config, step_fn, counter, callbacks))
    if chief and config.verbose >= 1:  # steps of the run, not Keras' epochs of eval_steps
        callbacks.append(Progress(step_fn, config.train_steps, counter.count))

    # A Keras epoch is eval_steps optimizer steps, i.e. eval_steps x grad_accum_steps batches.
    epochs = math.ceil(config.train_steps / config.eval_steps)
    started = time.monotonic()
    try:
        if early.catch_up(model):  # the evaluation the checkpoint owed stopped the run
            checkpoint.set_model(model)
            checkpoint.save("early stopping")
        else:
            model.fit(train_data, epochs=epochs,
                      steps_per_epoch=config.eval_steps * config.grad_accum_steps,
                      shuffle=False,
                      initial_epoch=min(start_step // config.eval_steps, epochs - 1),
                      callbacks=callbacks, verbose=2 if chief and config.verbose >= 2 else 0)
    except Exception as error:
        # A shard damaged while training ran reaches fit (tf.data) as an op error around our
        # message.
        damaged = re.search(r"pipelines\.errors\.DataError: (.*)", str(error))
        if damaged and not isinstance(error, DataError):
            raise DataError(damaged.group(1)) from None
        raise
    finally:
        if on_signal:  # fit skips on_train_end when it raises: the handlers go back here
            on_signal.restore_handlers()
    seconds = time.monotonic() - started

    tokens = counter.count()
    step = step_fn()
    preempted = on_signal.stop() if on_signal else None
    if preempted and step < config.train_steps and not early.stopped:
        raise preempted  # at train_steps, or stopped early, the run finishes as usual
    summary.update({"step": step, "seconds": round(seconds, 1), "tokens": tokens,
                    "tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
                    "stopped": early.reason or stop.reason or "epochs done"})
    if stop.first_batch_end is not None:  # the first step, its compilation included
        summary["first_step_seconds"] = round(stop.first_batch_end - started, 2)
    summary.update(origin.summary())
    if validation is not None:
        summary.update(validation.results())  # the pass at the last epoch's end, if current
    if chief:
        summary["model"] = str(run.save_model(model))
    summary["backend"] = keras.backend.backend()
    summary["precision"] = config.precision
    print(f"training done: step {start_step} -> {step} in {seconds:.0f} s "
          f"({summary['tokens_per_s']:.0f} tokens/s, source + target), {summary['stopped']}"
          + (f"; dev loss {summary['val_loss']:.3f}, perplexity {summary['val_perplexity']:.2f}"
             if "val_loss" in summary else ""), flush=True)
    return summary


def _early_stopping(config, run, validation, dev_bleu, step_fn, chief, state):
    """The run's `EarlyStopping` (inert without a dev set, patience and keep_best), with the
    counters of the checkpoint resumed from."""
    keep_best = config.keep_best if config.keep_best is not None else validation is not None
    if config.early_stopping_patience and validation is None:
        raise TrainingError(f"early_stopping_patience {config.early_stopping_patience} needs a "
                            f"dev set, and dataset {config.dataset!r} has none here: give "
                            "--dev-src and --dev-tgt, or leave early stopping off.")
    loss = config.early_stopping_metric == "loss"
    return EarlyStopping(validation if loss else dev_bleu, config.early_stopping_metric,
                         config.early_stopping_patience, config.early_stopping_min_delta,
                         config.eval_steps if loss else config.bleu_steps, config.train_steps,
                         step_fn, run, keep=chief and keep_best, state=state)


def tensorboard_log(run, config, step_fn, counter, callbacks):
    """The run's TensorBoard events (training/tensorboard.py), with the dev figures of the
    `Validation` and `DevBleu` callbacks among `callbacks`."""
    def find(kind):
        return next((c for c in callbacks if isinstance(c, kind)), None)

    return TensorBoardLog(run.logs_dir, step_fn, config.log_steps, counter.count,
                          config.describe(), find(Validation), find(DevBleu),
                          read_loss_tracker=config.strategy != "multiworker")


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
