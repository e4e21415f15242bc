"""Training with `model.fit`: the paper's recipe (Section 5) plus checkpoints, resume and
tf.distribute.

    from keras_transformer.config import make_config
    from keras_transformer.training import train
    train(make_config(preset="small", dataset="multi30k", train_steps=20000))

The same runs from the shell: `keras-transformer train --preset small --train-steps 20000`.
Restarting a killed run with the same command resumes from its last checkpoint: weights,
optimizer state, step and data position (the batches already seen are skipped).
"""

import json
import logging
import math
import os
import pathlib
import time

import keras
import tensorflow as tf

from keras_transformer.checkpoints import PeriodicCheckpoint, checkpoint_dir, make_manager
from keras_transformer.errors import UserError
from keras_transformer.loss import LabelSmoothedCrossEntropy
from keras_transformer.metrics import Perplexity, TokenAccuracy
from keras_transformer.model import Transformer
from keras_transformer.optimizer import paper_optimizer
from pipelines import sources, treebank
from pipelines.batching import count_lengths, make_dataset, tokenize_pairs
from pipelines.tokenizer import SubwordTokenizer, train_tokenizer

log = logging.getLogger(__name__)

# Keys that may change when a run is resumed; any other change means a different run.
RESUMABLE_CHANGES = {"train_steps", "time_limit_minutes", "verbose", "eval_steps", "bleu_steps",
                     "bleu_sentences", "checkpoint_minutes", "checkpoint_steps",
                     "keep_checkpoints"}


class TrainingError(UserError):
    """Training cannot go on; the message says why and what to do."""


# -- distribution ---------------------------------------------------------------------------


def make_strategy(config):
    """`default`, `mirrored` (local GPUs, else `num_replicas` logical CPUs), `multiworker`."""
    if config.strategy == "default":
        return tf.distribute.get_strategy()
    if config.strategy == "multiworker":
        if "TF_CONFIG" not in os.environ:
            raise TrainingError("strategy 'multiworker' needs TF_CONFIG (cluster and task) in "
                                "the environment of every worker.")
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return tf.distribute.MirroredStrategy()
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * config.num_replicas
        )
    except RuntimeError:
        pass  # already configured (or TensorFlow already started): use what exists
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][: config.num_replicas]
    return tf.distribute.MirroredStrategy(devices)


def is_chief(strategy):
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    return resolver.task_type == "chief" or (resolver.task_type == "worker"
                                             and resolver.task_id == 0)


# -- data -------------------------------------------------------------------------------------


def load_pairs(config, split):
    """(dataset of text pairs, raw files that key the vocabulary cache)."""
    if config.dataset == "multi30k":
        name = {"train": "train", "dev": "val", "test": "test2016"}[split]
        source_dir = config.source_dir or sources.default_multi30k_dir()
        files = ([pathlib.Path(source_dir) / f"train.{lang}.gz"
                  for lang in (config.src_lang, config.tgt_lang)] if source_dir else [])
        return sources.multi30k(name, config.src_lang, config.tgt_lang, config.data_dir,
                                source_dir), files
    if config.dataset == "wmt14":
        name = {"train": "train", "dev": "validation", "test": "test"}[split]
        return sources.wmt14(name, config.src_lang, config.tgt_lang, config.data_dir), []
    if config.dataset == "ptb":
        archive = treebank.default_ptb_archive(config.source_dir)
        trees = treebank.sample_splits(str(archive))[split]
        sentences, linearized = treebank.task_pairs(trees)
        return tf.data.Dataset.from_tensor_slices((sentences, linearized)), [archive]
    src, tgt = ((config.train_src, config.train_tgt) if split == "train"
                else (config.dev_src, config.dev_tgt))
    if src is None:
        return None, []
    return sources.parallel_text(src, tgt)[0], [src, tgt]


def split_texts(config, split, limit=None):
    """(source strings, target strings) of a split, at most `limit` pairs."""
    pairs, _ = load_pairs(config, split)
    if pairs is None:
        raise ValueError(f"The run has no {split} set; pass --src and --ref.")
    if limit:
        pairs = pairs.take(limit)
    items = list(pairs.as_numpy_iterator())
    return [s.decode("utf-8") for s, _ in items], [t.decode("utf-8") for _, t in items]


def prepare_tokenizer(config, run_dir, chief=True, wait_seconds=600):
    """Trains the shared vocabulary once per run (the chief does; other workers wait)."""
    vocab_dir = pathlib.Path(run_dir) / "vocab"
    model_path = vocab_dir / "spm.model"
    if not chief:
        deadline = time.time() + wait_seconds
        while not model_path.is_file():
            if time.time() > deadline:
                raise TrainingError(f"Waited {wait_seconds}s for the chief's vocabulary "
                                    f"{model_path}; is the output directory shared?")
            time.sleep(2)
        return SubwordTokenizer.load(model_path)
    pairs, files = load_pairs(config, "train")
    texts = (text.decode("utf-8") for pair in pairs.as_numpy_iterator() for text in pair)
    symbols = ()
    if config.dataset == "ptb":  # every bracket and POS tag is one piece
        archive = treebank.default_ptb_archive(config.source_dir)
        symbols = treebank.tree_symbols(treebank.sample_splits(str(archive))["train"])
    return train_tokenizer(texts, vocab_dir, config.vocab_size, source_files=files,
                           progress=config.verbose > 0, seed=config.seed, user_symbols=symbols)


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


def train_dataset(config, tokenizer, strategy, skip_batches, counter):
    pairs, _ = load_pairs(config, "train")

    def build(input_context=None):
        data = pairs
        if input_context is not None and input_context.num_input_pipelines > 1:
            data = data.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        dataset = make_dataset(data, tokenizer, config.tokens_per_batch, config.max_length,
                               shuffle=True, repeat=True, seed=config.seed,
                               pad_to_bucket=config.pad_to_bucket)
        # Resume: skip what was already trained on (per pipeline; replicas share a pipeline).
        per_pipeline = skip_batches
        if input_context is not None:
            per_pipeline = skip_batches * input_context.num_replicas_in_sync // max(
                1, input_context.num_input_pipelines)
        if per_pipeline:
            dataset = dataset.skip(per_pipeline)
        return dataset.apply(counter.step())

    if strategy.num_replicas_in_sync == 1:
        return build()
    return strategy.distribute_datasets_from_function(build)


# -- callbacks --------------------------------------------------------------------------------


class Validation(keras.callbacks.Callback):
    """Dev loss, perplexity and token accuracy at the end of every Keras epoch (eval_steps)."""

    def __init__(self, dataset, loss):
        super().__init__()
        self.dataset, self.loss = dataset, loss
        self._step = None

    def _compiled(self):
        if self._step is None:
            accuracy, perplexity = TokenAccuracy(), Perplexity()
            self._metrics = (accuracy, perplexity)

            @tf.function(reduce_retracing=True)
            def step(inputs, labels):
                logits = self.model(inputs, training=False)
                mask = tf.cast(labels != 0, tf.float32)
                loss = self.loss(labels, logits) * tf.reduce_sum(mask)
                accuracy.update_state(labels, logits)
                perplexity.update_state(labels, logits)
                return loss, tf.reduce_sum(mask)

            self._step = step
        return self._step

    def evaluate(self):
        step = self._compiled()
        for metric in self._metrics:
            metric.reset_state()
        total = count = 0.0
        for inputs, labels in self.dataset:
            loss, tokens = step(inputs, labels)
            total += float(loss)
            count += float(tokens)
        accuracy, perplexity = self._metrics
        return {"val_loss": total / max(count, 1.0), "val_perplexity": float(perplexity.result()),
                "val_token_accuracy": float(accuracy.result())}

    def on_epoch_end(self, epoch, logs=None):
        results = self.evaluate()
        if logs is not None:
            logs.update(results)
        print("validation: " + ", ".join(f"{k} {v:.4f}" for k, v in results.items()), flush=True)


class DevBleu(keras.callbacks.Callback):
    """sacreBLEU of greedy translations of the first dev sentences, every `every` steps."""

    def __init__(self, tokenizer, sources_text, references, every, step_fn, max_length):
        super().__init__()
        self.tokenizer, self.sources, self.references = tokenizer, sources_text, references
        self.every, self.step_fn, self.max_length = every, step_fn, max_length
        self._translator = None
        self.history = []

    def on_train_batch_end(self, batch, logs=None):
        step = self.step_fn()
        if step % self.every or (self.history and self.history[-1][0] == step):
            return
        import sacrebleu

        from keras_transformer.translate import Translator

        if self._translator is None:
            self._translator = Translator(self.model, self.tokenizer, beam_size=1,
                                          max_input_length=self.max_length)
        hypotheses = self._translator.translate(self.sources)
        bleu = sacrebleu.corpus_bleu(hypotheses, [self.references])
        self.history.append((step, bleu.score))
        print(f"\nstep {step}: dev BLEU (greedy, {len(self.sources)} sentences) "
              f"{bleu.score:.2f}", flush=True)


class StopAt(keras.callbacks.Callback):
    """Stops at `train_steps` optimizer steps or after `minutes` of training."""

    def __init__(self, train_steps, step_fn, minutes=None):
        super().__init__()
        self.train_steps, self.step_fn, self.minutes = train_steps, step_fn, minutes
        self.start = time.monotonic()
        self.reason = None

    def on_train_batch_end(self, batch, logs=None):
        if self.step_fn() >= self.train_steps:
            self.reason = f"reached train_steps={self.train_steps}"
        elif self.minutes and time.monotonic() - self.start >= 60 * self.minutes:
            self.reason = f"time limit of {self.minutes:g} minutes"
        if self.reason:
            self.model.stop_training = True


class NanGuard(keras.callbacks.Callback):
    """Stops training with a clear message when the loss becomes NaN or infinite."""

    def __init__(self, step_fn):
        super().__init__()
        self.step_fn = step_fn

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.model.stop_training = True
            raise TrainingError(
                f"Loss became {float(loss)} at step {self.step_fn()}. Training stopped; the "
                "last good checkpoint is kept. Lower the learning rate (lr_scale), raise "
                "warmup_steps, or use float32 precision, then restart."
            )


# -- the run ----------------------------------------------------------------------------------


def check_resumable(run_dir, config):
    saved = pathlib.Path(run_dir) / "config.json"
    if not saved.is_file():
        return
    previous = json.loads(saved.read_text())
    current = config.to_dict()
    changed = {k: (previous.get(k), current[k]) for k in current
               if previous.get(k) != current[k] and k not in RESUMABLE_CHANGES}
    if changed:
        details = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
        raise TrainingError(f"{run_dir} holds a run with a different config ({details}). "
                            "Use another output_dir, or delete that one to start over.")


def build_model(config, vocab_size):
    overrides = {} if config.dropout is None else {"dropout": config.dropout}
    model = Transformer.from_preset(config.preset, vocab_size=vocab_size, **overrides)
    model.build()
    return model


def compile_model(model, config):
    optimizer = paper_optimizer(model.d_model, config.warmup_steps, config.lr_scale,
                                config.grad_accum_steps)
    loss = LabelSmoothedCrossEntropy(config.label_smoothing)
    model.compile(optimizer=optimizer, loss=loss, metrics=[TokenAccuracy(), Perplexity()],
                  jit_compile=config.xla)
    # Under mixed_float16 Keras wraps the optimizer in a LossScaleOptimizer: use the wrapper,
    # so checkpoints hold the loss scale too.
    optimizer = model.optimizer
    optimizer.build(model.trainable_variables)
    return optimizer, loss


def train(config):
    """Runs (or resumes) training as configured. Returns a summary dict."""
    config = config.resolved()
    run_dir = pathlib.Path(config.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    check_resumable(run_dir, config)
    keras.mixed_precision.set_global_policy(config.precision)
    strategy = make_strategy(config)
    chief = is_chief(strategy)
    print("effective config:\n" + json.dumps(config.to_dict(), indent=2, sort_keys=True),
          flush=True)
    if chief:
        config.save(run_dir / "config.json")

    tokenizer = prepare_tokenizer(config, run_dir, chief)
    keras.utils.set_random_seed(config.seed)
    with strategy.scope():
        model = build_model(config, tokenizer.vocab_size)
        optimizer, loss = compile_model(model, config)

    ckpt_dir = checkpoint_dir(run_dir)
    if not chief:  # other workers save too (collectives), into a private scratch folder
        ckpt_dir = run_dir / f"scratch-worker-{strategy.cluster_resolver.task_id}"
    checkpoint, manager = make_manager(model, optimizer, ckpt_dir, config.keep_checkpoints)
    latest = tf.train.latest_checkpoint(str(checkpoint_dir(run_dir)))
    if latest:
        checkpoint.restore(latest).assert_existing_objects_matched()
        print(f"resumed from {latest} at step {int(optimizer.iterations.numpy())}", flush=True)

    def step_fn():
        return int(optimizer.iterations.numpy())

    start_step = step_fn()
    if start_step >= config.train_steps:
        print(f"nothing to do: step {start_step} >= train_steps {config.train_steps}")
        return {"step": start_step, "run_dir": str(run_dir)}
    counter = TokenCounter()
    batches_done = start_step * config.grad_accum_steps
    if batches_done:
        print(f"restoring the data position: skipping {batches_done} batches", flush=True)
    if chief and config.dataset != "wmt14":  # one cheap pass; WMT14 is too big to pre-count
        train_pairs, _ = load_pairs(config, "train")
        counts = count_lengths(train_pairs.apply(tokenize_pairs(tokenizer)), config.max_length)
        print(f"training data: {counts['pairs']} pairs, {counts['src_tokens']} source and "
              f"{counts['tgt_tokens']} target tokens; {counts['too_long']} pairs longer than "
              f"max_length={config.max_length} are dropped", flush=True)
    data = train_dataset(config, tokenizer, strategy, batches_done, counter)

    dev_pairs, _ = load_pairs(config, "dev")
    callbacks = [NanGuard(step_fn)]
    validation = None
    if dev_pairs is not None:
        dev = make_dataset(dev_pairs, tokenizer, config.tokens_per_batch, config.max_length,
                           shuffle=False)
        dev_count = count_lengths(dev_pairs.apply(tokenize_pairs(tokenizer)), config.max_length)
        if dev_count["too_long"]:
            log.warning("dev: %d pairs longer than max_length=%d are not evaluated",
                        dev_count["too_long"], config.max_length)
        validation = Validation(dev, loss)
        callbacks.append(validation)
        if config.bleu_steps:
            texts = list(dev_pairs.take(config.bleu_sentences).as_numpy_iterator())
            callbacks.append(DevBleu(tokenizer, [s.decode() for s, _ in texts],
                                     [t.decode() for _, t in texts], config.bleu_steps, step_fn,
                                     config.max_length))
    stop = StopAt(config.train_steps, step_fn, config.time_limit_minutes)
    checkpoint_minutes = None if config.strategy == "multiworker" else config.checkpoint_minutes
    checkpoint_steps = config.checkpoint_steps or (
        config.eval_steps if config.strategy == "multiworker" else None)
    callbacks += [
        PeriodicCheckpoint(manager, step_fn, checkpoint_minutes, checkpoint_steps),
        stop,
        keras.callbacks.TensorBoard(str(run_dir / "logs" / ("train" if chief else "worker")),
                                    update_freq=50),
    ]
    # A Keras epoch is eval_steps optimizer steps, i.e. eval_steps x grad_accum_steps batches.
    epochs = math.ceil(config.train_steps / config.eval_steps)
    started = time.monotonic()
    model.fit(data, epochs=epochs, steps_per_epoch=config.eval_steps * config.grad_accum_steps,
              shuffle=False,
              initial_epoch=min(start_step // config.eval_steps, epochs - 1),
              callbacks=callbacks, verbose=config.verbose if chief else 0)
    seconds = time.monotonic() - started
    tokens = int(counter.tokens.numpy())
    step = step_fn()
    summary = {"run_dir": str(run_dir), "start_step": start_step, "step": step,
               "seconds": round(seconds, 1), "tokens": tokens,
               "tokens_per_s": round(tokens / max(seconds, 1e-9), 1),
               "stopped": stop.reason or "epochs done"}
    if validation is not None:
        summary.update(validation.evaluate())
    if chief:
        path = run_dir / "model.keras"
        temporary = run_dir / "model.tmp.keras"
        model.save(temporary)
        os.replace(temporary, path)
        summary["model"] = str(path)
    print(f"training done: step {start_step} -> {step} in {seconds:.0f} s "
          f"({summary['tokens_per_s']:.0f} tokens/s, source + target), {summary['stopped']}"
          + (f"; dev loss {summary['val_loss']:.3f}, perplexity {summary['val_perplexity']:.2f}"
             if "val_loss" in summary else ""), flush=True)
    return summary
