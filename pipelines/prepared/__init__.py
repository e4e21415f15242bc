"""Prepared training data: a corpus tokenized once into shards of integer ids, read back as
token-budget batches from a deterministic position.

    data = prepare(folder, lambda: pairs, manifest={...}, vocabulary_settings={...})
    plan = BatchPlan(data, tokens_per_batch=25000, seed=1234)
    dataset = plan.dataset(start=batches_done)   # ((source, decoder input), labels), int32

    store.py    the prepared folder (`PreparedData`): its files, checks, cache key and lock
    writer.py   `prepare`: the vocabulary sample, tokenizing, writing shards
    plan.py     `BatchPlan`: the batch stream and its positions; the dev set's batches
"""

from pipelines.buckets import cut as cut_batches  # noqa: F401  (the rule's former name here)
from pipelines.defaults import SHARD_PAIRS  # noqa: F401
from pipelines.prepared.plan import (  # noqa: F401
    BatchPlan, as_dataset, batches_of_pairs, padded_batch, training_dataset, with_offsets)
from pipelines.prepared.store import (  # noqa: F401
    ARRAYS, FORMAT_VERSION, MANIFEST, STATISTICS, VOCABULARY, PreparedData, cache_key,
    default_cache_dir, describe)
from pipelines.prepared.writer import prepare, reservoir_sample  # noqa: F401
