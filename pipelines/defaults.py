"""Defaults of the input pipelines, in one table; signatures in `pipelines` name these instead of
writing the numbers. No imports: `keras_transformer.defaults` reads `MAX_LENGTH` from here."""

# Longest pair let in, in subword tokens with its specials (EOS; BOS and EOS): longer pairs are
# dropped, never truncated.
MAX_LENGTH = 256
# Pieces of the shared source-target vocabulary (ours, sized for Multi30k).
VOCAB_SIZE = 8000
# Sentences (both sides) drawn while streaming to train the vocabulary.
VOCABULARY_SAMPLE = 2_000_000
# Source pairs per prepared shard; a shard is read whole, so this bounds the reader's memory.
SHARD_PAIRS = 100_000
# Shards the batch plan reads together and mixes (memory: that many shards).
GROUP_SHARDS = 8
# Token budget per batch and side, padding included (the paper's about 25000).
TOKENS_PER_BATCH = 25000
# Length cells: the first boundary, and the factor from one boundary to the next.
MIN_BOUNDARY = 8
GROWTH = 1.1
# The coarse cells of the static shapes (a step compiled per batch shape: JAX, XLA): widths
# 2**k and 3 * 2**(k - 1) from this one on (8, 12, 16, 24, 32, 48, ...), each at most 1.5 times
# the last. Multi30k's batches fall in 6 of them, against 22 of the length cells above.
STATIC_MIN_WIDTH = 8
# Batches the tf.data pipeline shuffles together after cutting.
BATCH_SHUFFLE_BUFFER = 256
