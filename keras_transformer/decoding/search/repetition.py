"""Repetition controls: no repeated n-grams, and a penalty on the tokens already generated.
Off by default; asked for, the same rules in greedy search and in every mode of beam search.

Two rules, each on one hypothesis (the tokens it has generated so far, a forced prefix's
included):

    no_repeat_ngram_size n   a token that would complete an n-gram the hypothesis already
                             holds is banned (its log-probability NEG_INF): with tokens
                             y_1 .. y_t and n - 1 last ones y_{t-n+2} .. y_t, every y_{j+n-1}
                             whose y_j .. y_{j+n-2} equal them (fairseq's
                             --no-repeat-ngram-size, OpenNMT-py's -block_ngram_repeat,
                             Hugging Face's and CTranslate2's no_repeat_ngram_size). 0: off.
    repetition_penalty p     the logit z of every token the hypothesis has generated becomes
                             z / p where z > 0 and z * p where z < 0, before the softmax
                             (Keskar et al., 2019, CTRL; Hugging Face's and CTranslate2's
                             repetition_penalty): p > 1 makes a repeat less likely. 1: off.

The penalty applies to the step's logits, not to its log-probabilities: on log-probabilities
(all negative) the sign-aware rule would only ever multiply, and the renormalization would
differ. The searches then take the log-softmax of the penalized logits, so a hypothesis' score
is its log-probability under the penalized distributions (as CTranslate2's is). The n-gram ban
applies to the log-probabilities, as the other bans of a step do.

Two exemptions keep a forced output writable: where a target prefix forces the token, nothing
is banned (the prefix may itself repeat an n-gram), and in a constrained beam search the token
that advances one of a hypothesis' unmet phrases is never banned (a phrase that itself repeats
a bigram, or repeats what the hypothesis wrote, must still be met). The penalty still applies
there: it changes the scores, never what may be written.

`Repetition` holds the two values, Python numbers or scalar tensors (a SavedModel signature's
inputs: each rule then runs under a cond on its value, so that a request with the controls
off pays one cond per step and rule). `repetition(...)` gives None where both are Python
numbers at their defaults: the searches then build nothing for them, and run the ops they
ran before the controls existed. `RepetitionControl` is beam search's mode for them
(`search.modes`).

Everything is in `keras.ops` with static shapes (tf.function, XLA, JAX): the sets of tokens
are (N, V) masks made by one scatter over the (N, T) output buffer.
"""

import numbers

from keras import ops

from keras_transformer.decoding.request import DEFAULTS
from keras_transformer.decoding.search.modes import BeamMode
from keras_transformer.decoding.search.rules import NEG_INF
from pipelines.special_ids import PAD_ID

NGRAM_OFF = DEFAULTS["no_repeat_ngram_size"]  # 0
PENALTY_OFF = DEFAULTS["repetition_penalty"]  # 1.0


def repetition(no_repeat_ngram_size=NGRAM_OFF, repetition_penalty=PENALTY_OFF):
    """The controls asked for (`Repetition`), or None where both are Python numbers at their
    defaults (off: the searches build nothing for them)."""
    ngram_off = _is_python(no_repeat_ngram_size) and no_repeat_ngram_size == NGRAM_OFF
    penalty_off = _is_python(repetition_penalty) and repetition_penalty == PENALTY_OFF
    if ngram_off and penalty_off:
        return None
    return Repetition(None if ngram_off else no_repeat_ngram_size,
                      None if penalty_off else repetition_penalty)


def _is_python(value):
    return isinstance(value, numbers.Number)  # numpy's scalars too; not a tensor


def token_mask(tokens, where, vocab):
    """(N, V) bool: for each row, the tokens of `tokens` (N, T) int32 at the places `where`
    (bool, broadcastable to (N, T)) holds. One scatter (duplicates add up), no (N, T, V)
    one-hot."""
    shape = ops.shape(tokens)
    row_ids = ops.zeros_like(tokens) + ops.arange(shape[0], dtype=tokens.dtype)[:, None]
    indices = ops.reshape(ops.stack([row_ids, tokens], axis=-1), (-1, 2))
    counts = ops.scatter(indices, ops.reshape(ops.cast(ops.broadcast_to(where, shape),
                                                       "int32"), (-1,)), (shape[0], vocab))
    return counts > 0


def generated(tokens, length, vocab):
    """(N, V) bool: the tokens among the first `length` of each row of `tokens` (N, T)."""
    written = (ops.arange(ops.shape(tokens)[1]) < length)[None, :]  # (1, T)
    return token_mask(tokens, written, vocab)


def repeated_ngrams(tokens, length, size, vocab):
    """(N, V) bool: the tokens that would complete, after the first `length` of each row of
    `tokens` (N, T), an n-gram of `size` those already hold (`size` 0: none).

    An n-gram starting at j (tokens j .. j + n - 1, all written: j <= length - n) whose first
    n - 1 tokens equal the row's last n - 1 bans its last token.
    """
    width = ops.shape(tokens)[1]
    starts = ops.arange(width)
    size = size if _is_python(size) else ops.cast(size, "int32")
    length = ops.cast(length, "int32")
    matches = ops.broadcast_to(
        ops.logical_and(starts[None, :] <= length - size, size > 0), ops.shape(tokens))

    def compare(m, matches):  # the n-grams' token m against the row's last n - 1's
        earlier = ops.take(tokens, ops.minimum(starts + m, width - 1), axis=1)  # (N, T)
        last = ops.take(tokens, ops.clip(length - size + 1 + m, 0, width - 1)[None], axis=1)
        return ops.logical_and(matches, ops.equal(earlier, last))

    if _is_python(size):  # a search's own value: unrolled (n - 1 comparisons)
        for m in range(int(size) - 1):
            matches = compare(m, matches)
    else:  # a request's tensor: a loop of n - 1 comparisons
        matches = ops.fori_loop(0, size - 1, compare, matches)
    completing = ops.take(tokens, ops.clip(starts + size - 1, 0, width - 1), axis=1)
    return token_mask(completing, matches, vocab)


def penalized(logits, seen, penalty):
    """The sign-aware penalty on (N, V) `logits` where `seen` ((N, V) bool): z / p where
    z >= 0, z * p where z < 0 (z = 0 stays 0, whatever p)."""
    penalty = ops.cast(penalty, logits.dtype)
    return ops.where(seen, ops.where(logits < 0, logits * penalty, logits / penalty), logits)


def _when(value, off, apply, scores):
    """`apply(scores)` where the control's `value` is not `off`: decided here for a Python
    value, else by a cond (a request's tensors: off, the rule costs one cond)."""
    if _is_python(value):
        return apply(scores) if value != off else scores
    return ops.cond(ops.not_equal(value, ops.cast(off, value.dtype)), lambda: apply(scores),
                    lambda: scores)


class Repetition:
    """The two controls of a search, as rules on one step's (N, V) scores of N rows.

    The rules take `written`, a function () -> ((N, T) int32 tokens, length): the rows'
    tokens so far are the first `length` of `tokens`. It runs only where a rule does: with a
    request's tensors, inside the rule's cond, so that a step with the controls off runs the
    conds and nothing else.

    Args:
        no_repeat_ngram_size: n (a Python int or an int32 scalar tensor; None: off).
        repetition_penalty: p (a Python float or a float32 scalar tensor; None: off).
    """

    def __init__(self, no_repeat_ngram_size=None, repetition_penalty=None):
        self.ngram_size, self.penalty = no_repeat_ngram_size, repetition_penalty

    def logits(self, logits, written):
        """The penalty on the step's (N, V) float32 logits, before their softmax."""
        if self.penalty is None:
            return logits

        def penalize(z):
            tokens, length = written()
            return penalized(z, generated(tokens, length, ops.shape(z)[-1]), self.penalty)

        return _when(self.penalty, PENALTY_OFF, penalize, logits)

    def log_probs(self, log_probs, written, free=None):
        """The n-gram ban on the step's log-probabilities, (N, V) or (..., V) whose rows
        flatten to N (a beam search's (B, K, V)); `free`: None, or a function () -> bool
        broadcastable to (N, V), where nothing is banned (a forced prefix's rows, a phrase's
        next tokens)."""
        if self.ngram_size is None:
            return log_probs

        def ban(scores):
            tokens, length = written()
            shape = ops.shape(scores)
            banned = repeated_ngrams(tokens, length, self.ngram_size, shape[-1])
            if free is not None:
                banned = ops.logical_and(banned, ops.logical_not(free()))
            return ops.where(ops.reshape(banned, shape), NEG_INF, scores)

        return _when(self.ngram_size, NGRAM_OFF, ban, log_probs)


class RepetitionControl(BeamMode):
    """Beam search's mode for the controls (`Repetition`): the penalty on each hypothesis'
    logits (`adjust_logits`), the n-gram ban on its log-probabilities (`adjust`), both on the
    alive beams' tokens ("alive_seq"), with a forced prefix's tokens and the tokens that
    advance a constraint's phrases (the step's `advancing`, declared by the selection) exempt
    from the ban.

    Args:
        controls: a `Repetition`.
        forced_token: `rules.prefix_forcing(prefix)` (None: no prefix).
    """

    def __init__(self, controls, forced_token=None):
        self.controls, self.forced_token = controls, forced_token

    @staticmethod
    def _written(loop, step):
        """The alive beams' tokens as (B x K, T) rows, and how many are written."""
        def written():
            seq = loop["alive_seq"]
            return ops.reshape(seq, (-1, ops.shape(seq)[-1])), step.index

        return written

    def adjust_logits(self, loop, step, logits):
        return self.controls.logits(logits, self._written(loop, step))

    def adjust(self, loop, step, log_probs):  # (B, K, V)
        free = None if self.forced_token is None and step.advancing is None else (
            lambda: self._free(step, ops.shape(log_probs)))
        return self.controls.log_probs(log_probs, self._written(loop, step), free)

    def _free(self, step, shape):
        """(B x K, V) bool: where the ban does not apply: every token of the rows whose token
        the prefix forces, the token that advances each unmet phrase of a hypothesis
        (`shape`: the step's (B, K, V))."""
        free = None
        if self.forced_token is not None:
            free = self.forced_token(step.index)[0][:, None, None]  # (B, 1, 1)
        if step.advancing is not None:
            advancing = step.advancing()  # (B, K, C)
            advancing = ops.reshape(advancing, (-1, ops.shape(advancing)[-1]))
            writable = ops.reshape(token_mask(advancing, ops.not_equal(advancing, PAD_ID),
                                              shape[2]), shape)
            free = writable if free is None else ops.logical_or(free, writable)
        return ops.reshape(ops.broadcast_to(free, shape), (-1, shape[2]))
