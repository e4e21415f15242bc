"""Defaults that several commands share, in one table.

The command line, the `Translator`, the exports and the main job read these instead of writing
the numbers again. Each value is the paper's unless its comment says otherwise.
"""

import dataclasses

# Longest sentence, in subword tokens with EOS: training drops longer pairs, decoding truncates
# longer inputs (ours; the paper does not say). The vocabulary size and the pairs per prepared
# shard are the input pipelines' defaults too (pipelines/defaults.py holds them).
from pipelines.defaults import MAX_LENGTH, SHARD_PAIRS, VOCAB_SIZE  # noqa: E402,F401

# The train command's token budget per batch, per side and per replica: sized for a CPU (the
# paper's ~25000 is the tf.data pipeline's default, pipelines.defaults.TOKENS_PER_BATCH).
TRAIN_TOKENS_PER_BATCH = 4096

# Where exports go, relative to the working directory: EXPORT_DIR/<run name>/<version>/ for a
# SavedModel (TensorFlow Serving's layout), .../tflite/ and .../ctranslate2[-QUANTIZE]/ beside it.
EXPORT_DIR = "saved_models"


@dataclasses.dataclass(frozen=True)
class SearchSettings:
    """How a task decodes.

    Attributes:
        beam_size: hypotheses kept per sentence (1 = greedy search).
        alpha: GNMT length penalty exponent.
        extra_length: maximum output length = input length + extra_length.
        batch_size: sentences per search call (ours: a CPU-friendly size).
    """

    beam_size: int
    alpha: float
    extra_length: int
    batch_size: int


# Translation (paper Section 6.1): beam 4, alpha 0.6, input + 50.
TRANSLATION = SearchSettings(beam_size=4, alpha=0.6, extra_length=50, batch_size=64)
# Constituency parsing (paper Section 6.3): beam 21, alpha 0.3, input + 300.
PARSING = SearchSettings(beam_size=21, alpha=0.3, extra_length=300, batch_size=16)
