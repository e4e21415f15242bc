"""Beam search's prefix mode: while a sentence's target prefix lasts, its hypotheses have one
continuation, the prefix's token (`rules.prefix_forcing`, which greedy search shares); its
log-probabilities count in the scores."""

from keras import ops

from keras_transformer.decoding.search.modes import BeamMode
from keras_transformer.decoding.search.rules import NEG_INF, prefix_forcing


class PrefixForcing(BeamMode):
    """Bans, within each sentence's prefix, every token but the prefix's.

    Args:
        prefix: (B, P) int32 target tokens, 0-padded (a row of zeros is no prefix).
    """

    def __init__(self, prefix):
        self.forced_token = prefix_forcing(prefix)

    def adjust(self, loop, step, log_probs):
        forced, token = self.forced_token(step.index)
        other = ops.not_equal(ops.arange(step.vocab)[None, None, :], token[:, None, None])
        return ops.where(ops.logical_and(forced[:, None, None], other), NEG_INF, log_probs)
