"""What `model.fit` reads, in the order `train` asks for it: the prepared training data and its
vocabulary, the dev batches, the batches per optimizer step, and the training batches.

Training and dev batches take one path on every backend: the numpy batch plan of
`pipelines.prepared` cuts and pads them (`pipelines.buckets`). TensorFlow reads them through
tf.data (one pipeline per worker under tf.distribute, tokens counted in the graph); other
backends (JAX) read the same batches as numpy arrays with no TensorFlow imported, padded to a
fixed shape per length cell so that XLA compiles one step per cell. `pad_to_bucket` (on by
default under JAX and with --xla) makes those cells coarse (`pipelines.buckets.static_boundaries`):
a few shapes, so a few compilations, for more padding; the batches hold the same pairs either way.
"""

import logging

import keras
import numpy as np

from keras_transformer.training.strategy import input_pipelines, local_devices
from pipelines import datasets
from pipelines.errors import DataError
from pipelines.prepared import (BatchPlan, PreparedData, as_dataset, batches_of_pairs,
                                training_dataset)

log = logging.getLogger(__name__)


def on_tensorflow():
    return keras.backend.backend() == "tensorflow"


def check_data(config):
    """The run's own text files ("text" dataset), checked before anything is written into the
    run: a training or dev split whose files have no pair to read (empty, or every pair with
    an empty side) is refused naming them (DataError), before the run's config is saved (a
    run saved with the wrong files would refuse the corrected ones) and before training
    starts (a dev set of nothing would score a loss of 0). Reads up to each split's first pair.
    Training from prepared data (`prepared_data`) reads no training files."""
    for target in config.target_languages or [None]:  # every pair of a run of several
        where = config.data_arguments(target)
        for split in ("dev",) if config.prepared_data else ("train", "dev"):
            datasets.check_has_pairs(config.dataset, split, **where)


def training_data(run, config, chief, adopt=None):
    """The run's prepared training data and vocabulary: `config.prepared_data` if given (a
    prepared folder, e.g. carried to a machine without the corpus), else the cache's (prepared
    now if missing). A run that has a vocabulary keeps it; a new run takes `adopt` ((a
    sentencepiece model, its record): a fine-tuned run's parent's, `RunStart.vocabulary`)
    before its data are prepared with it, else the prepared data's.

    Returns:
        (PreparedData, the run's `Vocabulary`).
    """
    if adopt is not None and chief:
        run.use_vocabulary(*adopt)
    if config.prepared_data:
        data = PreparedData(config.prepared_data)
        if data.statistics["max_length"] < config.max_length:
            raise DataError(f"{data.directory} was prepared with max_length="
                            f"{data.statistics['max_length']}, below the run's "
                            f"{config.max_length}: give --max-length "
                            f"{data.statistics['max_length']}.")
    else:
        data = datasets.prepare_training_data(
            config.dataset, **config.prepared_data_arguments(),
            vocabulary=run.vocabulary_bytes(), progress=chief and config.verbose > 0)
    if chief:
        vocabulary = run.use_vocabulary(data.tokenizer_path, {
            "vocab_size": data.statistics["vocab_size"],
            "sha256": data.statistics["vocabulary_sha256"]})
    else:
        from pipelines.vocabulary import Vocabulary

        vocabulary = Vocabulary.load(data.tokenizer_path)
    return data, vocabulary


def dev_data(config, run):
    """The dev set: (batches to evaluate, (source texts, reference texts) for the dev BLEU,
    at most `bleu_sentences`), or (None, None) when the dataset has no dev split here. A run
    of several pairs: ({pair name: batches}, {pair name: (tagged sources, references)})
    (`training.pair_dev`).

    The pairs are tokenized with the run's vocabulary, then cut and padded as the training
    batches are (`batches_of_pairs`, in length order): a tf.data.Dataset on TensorFlow, a list
    of numpy batches elsewhere. Pairs longer than max_length are left out, as in training."""
    limit = config.bleu_sentences or None
    if config.target_languages is not None:
        from keras_transformer.training.pair_dev import pair_dev_texts

        texts = pair_dev_texts(config)
        if not texts:
            return None, None
        return ({name: _dev_batches(config, run, *pair, name)
                 for name, pair in texts.items()},
                {name: (s[:limit], r[:limit]) for name, (s, r) in texts.items()})
    where = config.data_arguments()
    if not datasets.has_split(config.dataset, "dev", **where):
        return None, None
    sources, references = datasets.split_texts(config.dataset, "dev", **where)
    batches = _dev_batches(config, run, sources, references)
    return batches, (sources[:limit], references[:limit])


def _dev_batches(config, run, sources, references, name="dev"):
    vocabulary = run.vocabulary()
    batches, too_long = batches_of_pairs(
        vocabulary.encode(sources), vocabulary.encode(references), config.tokens_per_batch,
        config.max_length, devices=None if on_tensorflow() else local_devices(),
        static=bool(config.pad_to_bucket))
    if too_long:
        log.warning("%s: %d pairs longer than max_length=%d are not evaluated", name, too_long,
                    config.max_length)
    if on_tensorflow():
        batches = as_dataset(batches.__iter__)
    return batches


def dev_passes(config, dev, dev_texts, loss, vocabulary):
    """{kind: the dev pass, called with a model}: "loss" the `DevLoss` of the dev batches,
    "translation" the `DevTranslation` of the first dev sentences (when bleu_steps is set); a
    run of several pairs' evaluate each pair and their mean (`training.pair_dev`). Empty
    without a dev set."""
    if dev is None:
        return {}
    if isinstance(dev, dict):
        from keras_transformer.training.pair_dev import PairDevLoss as DevLoss
        from keras_transformer.training.pair_dev import PairDevTranslation as DevTranslation
    else:
        from keras_transformer.training.callbacks import DevLoss, DevTranslation
    passes = {"loss": DevLoss(dev, loss)}
    if config.bleu_steps:
        passes["translation"] = DevTranslation(vocabulary, dev_texts, config.max_length)
    return passes


def batches_per_step(config, strategy):
    """Training batches each input pipeline hands over per optimizer step."""
    return (config.grad_accum_steps * strategy.num_replicas_in_sync
            // input_pipelines(strategy))


class TokenCounter:
    """Counts real source + target tokens handed to training (for tokens/s): a step of the
    tf.data pipeline on TensorFlow, of the numpy batch stream elsewhere."""

    def __init__(self):
        self._python = 0
        self._variable = None
        if on_tensorflow():
            import tensorflow as tf

            self._variable = tf.Variable(0, dtype=tf.int64, trainable=False)

    def count(self):
        return int(self._variable.numpy()) if self._variable is not None else self._python

    def numpy_step(self, batches):
        """Yields the numpy batches, counting what passes."""
        for batch in batches:
            (source, _), labels = batch
            self._python += int(np.count_nonzero(source) + np.count_nonzero(labels)
                                + np.count_nonzero((labels != 0).any(axis=1)))  # + BOS
            yield batch

    def tf_step(self):
        """Dataset -> dataset that counts what passes (TensorFlow)."""
        import tensorflow as tf

        def counted(inputs, labels):
            source, _ = inputs
            real = (tf.math.count_nonzero(source) + tf.math.count_nonzero(labels)
                    + tf.math.count_nonzero(tf.reduce_any(labels != 0, axis=1)))  # + BOS
            with tf.control_dependencies([self._variable.assign_add(real)]):
                return tf.nest.map_structure(tf.identity, (inputs, labels))

        return lambda dataset: dataset.map(counted)


def train_batches(data, config, strategy, start, counter):
    """Token-budget batches of the prepared training data, repeated, from batch number `start`
    of each input pipeline's stream, counted by `counter`: a tf.data.Dataset on TensorFlow (one
    pipeline per worker, each reading its own shards), a generator of numpy arrays elsewhere
    (the same batches, padded to a fixed shape per length cell). With `pad_to_bucket`, the fixed
    shapes of a few coarse cells, on every backend."""
    static = bool(config.pad_to_bucket)
    if not on_tensorflow():
        plan = BatchPlan(data, config.tokens_per_batch, config.max_length, config.seed,
                         devices=local_devices(), static=static)
        data.check(plan.shards)
        return counter.numpy_step(plan.batches(start))

    def build(input_context=None):
        worker, workers = 0, 1
        if input_context is not None:
            worker, workers = input_context.input_pipeline_id, input_context.num_input_pipelines
        plan, dataset = training_dataset(
            data, config.tokens_per_batch, config.max_length, config.seed, worker=worker,
            num_workers=workers, start=start, static=static)
        if workers > 1:
            print(f"input pipeline {worker} of {workers} reads shards "
                  f"{','.join(map(str, plan.shards))}", flush=True)
        return dataset.apply(counter.tf_step())

    if strategy.num_replicas_in_sync == 1:
        return build()
    return strategy.distribute_datasets_from_function(build)
