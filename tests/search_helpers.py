"""What the search tests share: an untrained tiny model of a small vocabulary and a batch of
random source rows of different lengths (EOS-terminated, 0-padded, as `Translator` pads)."""

import numpy as np
import tensorflow as tf

from keras_transformer import Transformer
from pipelines.special_ids import EOS_ID


def tiny_model(vocab, seed=7, num_layers=1):
    """The tiny preset with random weights (seeded) and no dropout, built; one layer each side
    by default (the preset has two): what the search tests check is the search around the
    model, not its depth, and each search they trace is about half the graph."""
    tf.keras.utils.set_random_seed(seed)
    model = Transformer.from_preset("tiny", vocab_size=vocab, dropout=0.0,
                                    num_layers=num_layers)
    model.build()
    return model


def source_rows(vocab, seed=0, rows=3, width=7):
    """(rows, width) int32 random ids in [4, vocab); row r holds width - r tokens with EOS."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, vocab, (rows, width)).astype("int32")
    for row in range(rows):
        length = width - row  # different lengths in one batch
        ids[row, length - 1] = EOS_ID
        ids[row, length:] = 0
    return ids
