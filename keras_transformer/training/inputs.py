"""What `model.fit` reads: the prepared training batches and the dev batches, on each backend.

TensorFlow reads them through tf.data (one pipeline per worker under tf.distribute, counted in
the graph). Other backends (JAX) read the same batch plan as numpy arrays from a Python
generator, with no TensorFlow imported: the same batches in the same order from the same data
position, padded to their length cell so that XLA compiles one step per cell shape.
"""

import logging

import keras
import numpy as np

from keras_transformer.training.strategy import input_pipelines, local_devices
from pipelines import datasets
from pipelines.errors import DataError
from pipelines.prepared import BatchPlan, PreparedData, batches_of_pairs

log = logging.getLogger(__name__)


def on_tensorflow():
    return keras.backend.backend() == "tensorflow"


class TokenCounter:
    """Counts real source + target tokens handed to training (for tokens/s)."""

    def __init__(self):
        self._python = 0
        self._variable = None
        if on_tensorflow():
            import tensorflow as tf

            self._variable = tf.Variable(0, dtype=tf.int64, trainable=False)

    def count(self):
        return int(self._variable.numpy()) if self._variable is not None else self._python

    def add_numpy(self, inputs, labels):
        source, _ = inputs
        self._python += int(np.count_nonzero(source) + np.count_nonzero(labels)
                            + np.count_nonzero((labels != 0).any(axis=1)))  # + BOS

    def tf_step(self):
        """Dataset -> dataset that counts what passes (TensorFlow)."""
        import tensorflow as tf

        def count(inputs, labels):
            source, _ = inputs
            real = (tf.math.count_nonzero(source) + tf.math.count_nonzero(labels)
                    + tf.math.count_nonzero(tf.reduce_any(labels != 0, axis=1)))  # + BOS
            return tf.group(self._variable.assign_add(real))

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


def training_data(run, config, chief):
    """The run's prepared training data and vocabulary: `config.prepared_data` if given (a
    prepared folder, e.g. carried to a machine without the corpus), else the cache's (prepared
    now if missing). A run that has a vocabulary keeps it; a new run takes the prepared data's.

    Returns:
        (PreparedData, the run's `Vocabulary`).
    """
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


def train_batches(data, config, strategy, start, counter):
    """Token-budget batches of the prepared training data, repeated, from batch number `start`
    of each input pipeline's stream: a tf.data.Dataset on TensorFlow (one pipeline per worker,
    each reading its own shards), a generator of numpy arrays elsewhere."""
    if not on_tensorflow():
        plan = BatchPlan(data, config.tokens_per_batch, config.max_length, config.seed,
                         pad_to_bucket=config.pad_to_bucket)
        data.check(plan.shards)
        return _counted_numpy(plan.batches(start), counter, plan.bounds,
                              config.tokens_per_batch, local_devices())

    from pipelines.prepared import training_dataset

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
        return dataset.apply(counter.tf_step())

    if strategy.num_replicas_in_sync == 1:
        return build()
    return strategy.distribute_datasets_from_function(build)


def _counted_numpy(batches, counter, bounds, tokens_per_batch, devices=1):
    """Counts each batch's tokens and pads it to a fixed shape (`fixed_shape`)."""
    for batch in batches:
        counter.add_numpy(*batch)
        yield fixed_shape(batch, bounds, tokens_per_batch, devices)


def fixed_shape(batch, bounds, tokens_per_batch, devices=1):
    """Pads a batch to one of a few shapes, so that XLA compiles one step per length cell:
    both sides to the cell boundary W at or above the longer side, the rows to the most rows
    any batch of that cell can have (tokens_per_batch // (the boundary below W + 1)), rounded
    up to a multiple of the devices the batch is split over. Padding carries no loss, and the
    batches themselves (which pairs, in which order) are those TensorFlow trains on."""
    (source, target_in), labels = batch
    longest = max(source.shape[1], target_in.shape[1])
    cell = int(np.searchsorted(bounds, longest))
    width = int(bounds[cell]) if cell < len(bounds) else longest
    below = int(bounds[cell - 1]) if 0 < cell <= len(bounds) else 0
    rows = max(tokens_per_batch // (below + 1), len(source))
    rows += -rows % devices

    def pad(array):
        return np.pad(array, ((0, rows - array.shape[0]), (0, width - array.shape[1])))

    return (pad(source), pad(target_in)), pad(labels)


def dev_data(config, tokenizer_source):
    """The dev set: (batches to evaluate, (source texts, reference texts) or None when no dev
    BLEU is asked for), or (None, None) when the dataset has no dev split here.

    On TensorFlow the batches are a tf.data.Dataset (`tokenizer_source`: the run), elsewhere a
    list of numpy batches tokenized with the run's `Vocabulary`."""
    if on_tensorflow():
        from pipelines.batching import count_lengths, make_dataset, tokenize_pairs

        pairs = datasets.load_pairs(config.dataset, "dev", **config.data_arguments())
        if pairs is None:
            return None, None
        tokenizer = tokenizer_source.tokenizer()
        counts = count_lengths(pairs.apply(tokenize_pairs(tokenizer)), config.max_length)
        _report_too_long(counts["too_long"], config.max_length)
        batches = make_dataset(pairs, tokenizer, config.tokens_per_batch, config.max_length,
                               shuffle=False)
        # The texts serve only the dev BLEU: read them only when it is on.
        texts = datasets.pair_texts(pairs, config.bleu_sentences) if config.bleu_steps else None
        return batches, texts
    try:
        sources, references = datasets.split_texts(config.dataset, "dev",
                                                   **config.data_arguments())
    except DataError as error:
        log.warning("no dev evaluation: %s", error)
        return None, None
    vocabulary = tokenizer_source.vocabulary()
    batches, too_long = batches_of_pairs(vocabulary.encode(sources), vocabulary.encode(references),
                                         config.tokens_per_batch, config.max_length)
    _report_too_long(too_long, config.max_length)
    limit = config.bleu_sentences
    return batches, (sources[:limit] if limit else sources, references[:limit] if limit
                     else references)


def _report_too_long(count, max_length):
    if count:
        log.warning("dev: %d pairs longer than max_length=%d are not evaluated", count,
                    max_length)
