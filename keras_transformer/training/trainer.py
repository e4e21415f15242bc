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

import json
import logging
import math
import re
import time

import keras
import tensorflow as tf

from keras_transformer.runs import Run
from keras_transformer.training.callbacks import (DevBleu, NanGuard, PeriodicCheckpoint,
                                                  Progress, StopAt, Validation)
from keras_transformer.training.loss import LabelSmoothedCrossEntropy
from keras_transformer.training.optimizer import paper_optimizer
from keras_transformer.training.strategy import input_pipelines, is_chief, make_strategy, task_id
from pipelines import datasets
from pipelines.errors import DataError
from pipelines.batching import count_lengths, make_dataset, tokenize_pairs
from pipelines.prepared import describe, training_dataset
from pipelines.tokenizer import SubwordTokenizer

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
    model.compile(optimizer=optimizer, loss=loss, jit_compile=config.xla)
    # Under mixed_float16 Keras wraps the optimizer in a LossScaleOptimizer: use the wrapper,
    # so checkpoints hold the loss scale too.
    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)
    return optimizer, loss


class TokenCounter:
    """Counts real source + target tokens handed to training (for the closing tokens/s)."""

    def __init__(self):
        self.tokens = tf.Variable(0, dtype=tf.int64, trainable=False)

    def step(self):
        def count(inputs, labels):
            source, _ = inputs
            real = (tf.math.count_nonzero(source) + tf.math.count_nonzero(labels)
                    + tf.math.count_nonzero(tf.reduce_any(labels != 0, axis=1)))  # + BOS
            return tf.group(self.tokens.assign_add(real))

        def apply(dataset):
            def counted(inputs, labels):
                with tf.control_dependencies([count(inputs, labels)]):
                    return tf.nest.map_structure(tf.identity, (inputs, labels))

            return dataset.map(counted)

        return apply


def batches_per_step(config, strategy):
    """Training batches each input pipeline hands over per optimizer step."""
    return (config.grad_accum_steps * strategy.num_replicas_in_sync
            // input_pipelines(strategy))


def train_dataset(data, config, strategy, start, counter):
    """Token-budget batches of the prepared training data, repeated, one pipeline per worker
    (each reading its own shards), from batch number `start` of each pipeline's stream."""

    def build(input_context=None):
        worker, workers = 0, 1
        if input_context is not None:
            worker, workers = input_context.input_pipeline_id, input_context.num_input_pipelines
        plan, dataset = training_dataset(
            data, config.tokens_per_batch, config.max_length, config.seed,
            pad_to_bucket=config.pad_to_bucket, worker=worker, num_workers=workers, start=start)
        if workers > 1:
            print(f"input pipeline {worker} of {workers} reads shards "
                  f"{','.join(map(str, plan.shards))}", flush=True)
        return dataset.apply(counter.step())

    if strategy.num_replicas_in_sync == 1:
        return build()
    return strategy.distribute_datasets_from_function(build)


def training_data(run, config, chief):
    """The run's prepared training data (from the cache, else prepared now) and tokenizer. A
    run that has a vocabulary keeps it; a new run takes the prepared data's."""
    data = datasets.prepare_training_data(config.dataset, **config.prepared_data_arguments(),
                                          vocabulary=run.vocabulary_bytes(),
                                          progress=chief and config.verbose > 0)
    if chief:
        tokenizer = run.use_vocabulary(data.tokenizer_path, {
            "vocab_size": data.statistics["vocab_size"],
            "sha256": data.statistics["vocabulary_sha256"]})
    else:
        tokenizer = SubwordTokenizer.load(data.tokenizer_path)
    return data, tokenizer


def _report_dev_lengths(pairs, tokenizer, max_length):
    counts = count_lengths(pairs.apply(tokenize_pairs(tokenizer)), max_length)
    if counts["too_long"]:
        log.warning("dev: %d pairs longer than max_length=%d are not evaluated",
                    counts["too_long"], max_length)


def train(config):
    """Runs (or resumes) training as configured. Returns a summary dict."""
    run = Run(config.output_dir)
    config = run.config_for(config)  # a new run's config, or the saved one continued
    keras.mixed_precision.set_global_policy(config.precision)
    strategy = make_strategy(config.strategy, config.num_replicas)
    chief = is_chief(strategy)
    print("effective config:\n" + json.dumps(config.to_dict(), indent=2, sort_keys=True),
          flush=True)
    if chief:
        run.save_config(config)

    # Data and vocabulary: the training pairs come prepared (tokenized, sharded) from the cache.
    data, tokenizer = training_data(run, config, chief)
    if chief:
        print(describe(data), flush=True)
    dev_pairs = datasets.load_pairs(config.dataset, "dev", **config.data_arguments())

    # Model, optimizer, checkpoints; resume from the newest readable checkpoint.
    keras.utils.set_random_seed(config.seed)
    with strategy.scope():
        model = run.build_model()
        optimizer, loss = compile_model(model, config)
    directory = None if chief else run.worker_checkpoint_dir(task_id(strategy))
    # The data position (batches each input pipeline has handed over) is saved with every
    # checkpoint: a resumed run reads on from exactly there.
    position = tf.Variable(0, dtype=tf.int64, trainable=False)
    checkpoint, manager = run.checkpoint_manager(model, optimizer, config.keep_checkpoints,
                                                 directory, data_position=position)
    restored = run.restore(checkpoint)
    per_step = batches_per_step(config, strategy)

    def step_fn():
        return int(optimizer.iterations.numpy())

    start_step = step_fn()
    start = 0
    if restored:
        saved = run.data_position(restored)
        start = start_step * per_step if saved is None else saved
        print(f"resumed from {restored} at step {start_step}, training batch {start}",
              flush=True)
    if start_step >= config.train_steps:
        print(f"nothing to do: step {start_step} >= train_steps {config.train_steps}")
        return {"step": start_step, "run_dir": str(run.directory)}
    counter = TokenCounter()
    train_data = train_dataset(data, config, strategy, start, counter)

    callbacks = [NanGuard(step_fn)]
    validation = None
    if dev_pairs is not None:
        dev = make_dataset(dev_pairs, tokenizer, config.tokens_per_batch, config.max_length,
                           shuffle=False)
        _report_dev_lengths(dev_pairs, tokenizer, config.max_length)
        validation = Validation(dev, loss, step_fn)
        callbacks.append(validation)
        if config.bleu_steps:
            sources, references = datasets.pair_texts(dev_pairs, config.bleu_sentences)
            callbacks.append(DevBleu(tokenizer, sources, references, config.bleu_steps, step_fn,
                                     config.max_length))
    stop = StopAt(config.train_steps, step_fn, config.time_limit_minutes)
    multiworker = config.strategy == "multiworker"
    checkpoint_minutes = None if multiworker else config.checkpoint_minutes
    checkpoint_steps = config.checkpoint_steps or (config.eval_steps if multiworker else None)
    callbacks += [
        PeriodicCheckpoint(manager, step_fn, checkpoint_minutes, checkpoint_steps,
                           before_save=lambda step, batches: position.assign(
                               start + batches * per_step // config.grad_accum_steps)),
        stop,
        keras.callbacks.TensorBoard(str(run.logs_dir("train" if chief else "worker")),
                                    update_freq=50),
    ]
    if chief and config.verbose >= 1:  # steps of the run, not Keras' epochs of eval_steps
        callbacks.append(Progress(step_fn, config.train_steps, counter.tokens))

    # A Keras epoch is eval_steps optimizer steps, i.e. eval_steps x grad_accum_steps batches.
    epochs = math.ceil(config.train_steps / config.eval_steps)
    started = time.monotonic()
    try:
        model.fit(train_data, epochs=epochs,
                  steps_per_epoch=config.eval_steps * config.grad_accum_steps, shuffle=False,
                  initial_epoch=min(start_step // config.eval_steps, epochs - 1),
                  callbacks=callbacks, verbose=2 if chief and config.verbose >= 2 else 0)
    except tf.errors.OpError as error:
        # A shard damaged while training ran reaches fit as an op error around our message.
        damaged = re.search(r"pipelines\.errors\.DataError: (.*)", str(error))
        if damaged:
            raise DataError(damaged.group(1)) from None
        raise
    seconds = time.monotonic() - started

    tokens = int(counter.tokens.numpy())
    step = step_fn()
    summary = {"run_dir": str(run.directory), "start_step": start_step, "step": step,
               "seconds": round(seconds, 1), "tokens": tokens,
               "tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
               "stopped": stop.reason or "epochs done"}
    if validation is not None:
        summary.update(validation.results())  # the pass at the last epoch's end, if current
    if chief:
        summary["model"] = str(run.save_model(model))
    print(f"training done: step {start_step} -> {step} in {seconds:.0f} s "
          f"({summary['tokens_per_s']:.0f} tokens/s, source + target), {summary['stopped']}"
          + (f"; dev loss {summary['val_loss']:.3f}, perplexity {summary['val_perplexity']:.2f}"
             if "val_loss" in summary else ""), flush=True)
    return summary
