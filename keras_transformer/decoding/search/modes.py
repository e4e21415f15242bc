"""The modes of the searches: what a plain search, one with a target prefix, one with lexical
constraints and a compact one do differently, each a small object whose hooks the one beam step
(`beam_search.BeamStep`) calls; the loop's shape (`LoopShape`) is greedy search's mode too
(`greedy.PickStep`).

A step reads its log-probabilities, lets every mode adjust them, expands the beams into
candidates, lets every mode track them, chooses the finished pool and the alive beams, lets
every mode carry its state over, then decides which sentences are done and shapes the next loop
state. Three kinds of mode:

    BeamMode    hooks every mode may have; the step calls them on each mode in turn (the
                modes' order, `Modes.all`), each getting what the one before returned:
                  start    the loop's first values, with the mode's own
                  adjust_logits  the step's logits, before their log-softmax
                  adjust   the step's log-probabilities, before any candidate is chosen
                  track    the candidates, once chosen: their validity, the mode's state of each
                  advance  the next loop values, once the alive beams are chosen
    Selection   a BeamMode that also chooses (one per search): the candidates a step
                expands to, the finished pool's order, the alive beams; here by score alone
                (the plain search); `constraints.ConstraintBanks` by banks
    LoopShape   a BeamMode that also shapes the loop (one per search, greedy or beam): how
                the step's state is held, which sentences a step computes, how the next loop
                state follows the alive beams (or the rows that stay), the result; here every
                sentence to the end; `compact.CompactLoop` drops the done ones

Every default leaves its input as it is (or is the plain search's rule), so a mode overrides only
the hooks it needs; a new mode is a new file with its class and one line in
`beam_search.beam_modes` (docs/design.md has the picture).

Every hook of a step gets `loop`, the loop state (a dict) the step starts from, and `step`, what
the step knows besides (a `Step`). Modes talk through these, never through each other: a mode
reads another's state only where the step declares it (`Step.advancing`), and declares which of
its loop values are per sentence (`per_sentence`), for the loop shape to drop. Tensors: B
sentences computed this step, K beams, V the vocabulary, M candidates per sentence, T the
output buffer's length.
"""

from typing import NamedTuple

import keras
from keras import ops, tree

from keras_transformer.decoding.search.rules import NEG_INF
from keras_transformer.decoding.search.top_k import best_continuations, gather_beams
from keras_transformer.layers import rows as on_rows


class Step(NamedTuple):
    """What a step's hooks may read besides the loop state."""

    index: object  # int32 scalar: the step, the position of the tokens it chooses
    rows: object  # B: the sentences this step computes
    vocab: object  # V
    limits: object  # (B,) int32 output limits (EOS included)
    at_limit: object  # (B, 1, 1) bool: the hypotheses must end here (EOS forced)
    # None, or a function () -> (B, K, C) int32: the token that advances each unmet phrase of
    # each hypothesis (PAD where none), which no rule may ban (`Selection.advancing`).
    advancing: object = None


class BeamMode:
    """A mode of beam search: the hooks the shared step calls on it, each a no-op here."""

    # The names of this mode's loop values of one row per sentence (B, ...), which a compact
    # loop (`compact.CompactLoop`) drops with their sentence.
    per_sentence = ()

    def start(self, loop):
        """The loop's first values (a dict of tensors), with this mode's own added."""
        return loop

    def adjust_logits(self, loop, step, logits):
        """The step's float32 logits (B x K, V), rows in the state's order (row b x K + k:
        sentence b, beam k), before their log-softmax: a rule on the model's distribution
        itself (`repetition.RepetitionControl`'s penalty)."""
        return logits

    def adjust(self, loop, step, log_probs):
        """The step's log-probabilities (B, K, V) before the candidates are chosen, with what
        this mode bans (NEG_INF) or penalizes."""
        return log_probs

    def track(self, loop, step, candidates):
        """The chosen candidates (a dict of (B, M) "scores", "parents", "tokens", "real":
        whether each is a hypothesis at all), with this mode's state of each or fewer "real"."""
        return candidates

    def advance(self, loop, step, new, candidates, keep):
        """The next loop values (a dict: the pool, the alive beams, "index"), with this mode's
        own for the alive beams `keep` ((B, K) indices into the candidates) added; may lower
        the alive scores before the step decides which sentences are done."""
        return new


class Selection(BeamMode):
    """How a step chooses, by score alone: the 2K best continuations, the K best finished
    hypotheses, the K best continuations other than EOS.

    Args:
        beam_size: K (a Python int, or a scalar tensor).
    """

    # The loop value the finished pool is ordered by (the early termination reads it).
    pool_key = "finished_scores"

    def __init__(self, beam_size):
        self.beam_size = beam_size

    def expand(self, loop, step, log_probs):
        """The candidates of a step: "scores" (log P of the hypothesis), "parents" (its beam)
        and "tokens", each (B, M): here the 2K best, by an exact top-k in two stages."""
        scores, ids = best_continuations(loop["alive_log_probs"], log_probs, 2 * self.beam_size)
        return dict(scores=scores, parents=ids // step.vocab, tokens=ids % step.vocab)

    def finish(self, loop, step, candidates, new_scores):
        """The finished pool: the K best of the pool and `new_scores` ((B, M) normalized scores
        of the candidates that end here, NEG_INF for the others). Returns (values, keep):
        the pool's new "finished_scores" (and whatever else this selection keeps of it), and
        (B, K) indices into the pool and the candidates, concatenated."""
        scores, keep = ops.top_k(ops.concatenate([loop["finished_scores"], new_scores], axis=1),
                                 k=self.beam_size)
        return {"finished_scores": scores}, keep

    def keep_alive(self, loop, step, candidates, is_eos):
        """The alive beams: ((B, K) log P, (B, K) indices into the candidates), here the K best
        candidates other than EOS (`is_eos`, (B, M) bool), best first."""
        return ops.top_k(ops.where(is_eos, NEG_INF, candidates["scores"]), k=self.beam_size)

    def best_alive(self, new, step):
        """(B,) the best log P of each sentence's alive beams in the next loop values `new`
        that may still end (here all: the alive beams are sorted, the first)."""
        return new["alive_log_probs"][:, 0]

    def advancing(self, loop):
        """The step's `Step.advancing`: None here (no phrases)."""
        return None


class LoopShape(BeamMode):
    """The loop over every sentence to its end: the step's state is its rows (what it reads
    once per sentence stays in the step's closure), a step computes all B sentences, a done
    sentence's rows compute on, masked, and the decoder state follows the alive beams (greedy
    search: each row stays).

    A search gets the class (`beam_search(shape=...)`, `greedy_search(shape=...)`) and makes
    the loop's own from its values; `model_step(shape=...)` asks it how to hold the step's
    state (`step_state`).

    Args:
        batch: B.
        limits: (B,) int32 output limits.
        rows_per_sentence: R, the rows of the step's state per sentence (beam search's K).
        per_sentence: the names of the search's loop values of one row per sentence and its
            modes' (`BeamMode.per_sentence`).
        outputs: the names of those the search returns.
        per_row: the names of loop values of one row per row of the step's state (greedy
            search's: its rows are its sentences where R is 1).
        prefix: the search's target prefix ((B, P), read outside the loop values), or None.
        started: whether some sentences may be done before the first step (the loop's
            "done" given to the search).
    """

    def __init__(self, batch, limits, rows_per_sentence=1, per_sentence=(), outputs=(),
                 per_row=(), prefix=None, started=False):
        self.batch, self.limits = batch, limits

    @staticmethod
    def step_state(step_fn, rows, sentences):
        """(step function, first state) for the search from `step_fn` over the pair (rows,
        sentences) (`step.model_step`): here the state is `rows` alone, `sentences` (what the
        step reads once per sentence; None: nothing) stay in the step's closure."""
        def rows_step(tokens, state, index):
            logits, (state, _) = step_fn(tokens, (state, sentences), index)
            return logits, state

        return rows_step, rows

    def searching(self, loop):
        """(rows, limits): how many sentences this step computes and their output limits."""
        return self.batch, self.limits_of(loop)

    def limits_of(self, loop):
        """The output limits of the sentences this step computes."""
        return self.limits

    def unless_done(self, loop, values, fill):
        """A step's (B,) `values` with `fill` where the sentence was done before it (its rows
        compute on, here)."""
        return ops.where(loop["done"], fill, values)

    def done_after(self, loop, ending):
        """(B,) bool: the sentences done after a step, where those `ending` ((B,) bool) end
        at it."""
        return ops.logical_or(loop["done"], ending)

    def next(self, loop, step, new, state, parent_rows, next_tokens):
        """The next loop state: `new` with the step's decoder `state` reordered to the alive
        beams' parents (`parent_rows`, (B, K) rows of the state) and their tokens
        (`next_tokens`, (B, K)) to feed."""
        with keras.name_scope("reorder_caches"):
            parent_rows = ops.reshape(parent_rows, (-1,))
            new["state"] = tree.map_structure(lambda t: on_rows.take(t, parent_rows), state)
        new["tokens"] = ops.reshape(next_tokens, (-1,))
        return new

    def stay(self, loop, new, state, next_tokens):
        """The next loop state of a search whose rows stay where they are (greedy search):
        `new` with the step's decoder `state` and the (N,) `next_tokens` to feed."""
        return dict(new, state=state, tokens=next_tokens)

    def results(self, final):
        """The loop values the search returns, from the last loop state."""
        return final


class Modes(NamedTuple):
    """The modes one beam search composes: one `selection`, one `shape` and any `others`
    (called first, in their order)."""

    selection: Selection
    shape: LoopShape
    others: tuple = ()

    @property
    def all(self):
        """Every mode, in the order the step calls their hooks."""
        return self.others + (self.selection, self.shape)
