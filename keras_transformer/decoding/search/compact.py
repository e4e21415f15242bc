"""Compact search loops: a sentence leaves the loop once it is done, so that a step computes only
the sentences still searching (`beam_search(compact=True)`, `greedy_search(compact=True)`).

Where shapes may follow values (TensorFlow's graphs without XLA) a loop variable may change size
from one iteration to the next when its size has no static value. A compact loop keeps, per
sentence still searching, its number in the batch ("live") and whatever the loop reads of it;
the step's state is a pair (rows, sentences) (`step.model_step(compact=True)`): the rows of its
beams and what the step reads once per sentence (cross-attention keys and values). At a step
where some sentences are done, their results are written to full-size outputs at their numbers
and every per-sentence tensor keeps the others' rows (`shrink`); the loop ends when none is left.
`CompactLoop` is beam search's loop shape for it (`search.modes`).
"""

import keras
from keras import ops, tree

from keras_transformer.decoding.search.compiling import dynamic_shapes
from keras_transformer.decoding.search.modes import LoopShape
from keras_transformer.layers import rows as on_rows


def by_default(static, cached, *unsupported):
    """Whether a body compacts its loop when not told: a cached search whose shapes may
    follow values (TensorFlow's graphs without XLA), without any of `unsupported` (a
    prefix, constraints: None when absent)."""
    return (not static and dynamic_shapes() and cached
            and all(option is None for option in unsupported))


def compact_start(per_sentence, state, rows_per_sentence, done=None):
    """The loop's first values: `per_sentence` (a nest of (B, ...) tensors) and `state` (rows
    (B x R, ...), sentences (B, ...)) as they are where the batch size has no static value (a
    graph traced for any batch), else taken through a gather of no static size (a graph traced
    for one batch size, or eager: a loop variable of static size may not change size).
    `done`: None, or (B,) bool, the sentences done before the loop starts: they are left out
    (a gather, always)."""
    first = tree.flatten(per_sentence)[0]
    if done is None and not isinstance(ops.shape(first)[0], int):
        return per_sentence, state
    live = ops.nonzero(ops.logical_not(done) if done is not None else ops.greater_equal(
        ops.arange(ops.shape(first)[0]), 0))[0]
    rows = ops.reshape(live[:, None] * rows_per_sentence
                       + ops.arange(rows_per_sentence)[None, :], (-1,))
    row_state, sentences = state
    return (take(per_sentence, live),
            (take(row_state, rows), take(sentences, live)))


def shrink(done, kept, live, outputs):
    """The sentences that are `done` ((n,) bool) leave: each (buffer, values) of `outputs` gets
    `values`' rows of the done sentences at their numbers `live[done]` in `buffer` (full size),
    and every tensor of the nest `kept` ((n, ...)) keeps the rows of the others. Only at a step
    where some sentence is done (a cond). Returns (kept, buffers)."""
    def drop():
        gone, stay = ops.nonzero(done)[0], ops.nonzero(ops.logical_not(done))[0]
        where = ops.expand_dims(on_rows.take(live, gone), 1)
        buffers = tuple(ops.scatter_update(buffer, where, on_rows.take(values, gone))
                        for buffer, values in outputs)
        return take(kept, stay), buffers

    return ops.cond(ops.any(done), drop,
                    lambda: (kept, tuple(buffer for buffer, _ in outputs)))


def take(nest, indices):
    """Every tensor of `nest`, rows `indices` of its first axis."""
    return tree.map_structure(lambda t: on_rows.take(t, indices), nest)


# A compact beam search's state per sentence still searching (the model's state aside), and
# the finished pool every sentence leaves behind.
_POOL = ("finished_seq", "finished_scores", "finished_log_probs")
_PER_SENTENCE = _POOL + ("alive_seq", "alive_log_probs", "done", "live", "limits")


class CompactLoop(LoopShape):
    """Beam search's compact loop: a sentence leaves once it is done, its finished pool
    written to the output ("out_..." buffers) as it leaves. The loop state keeps the searching
    sentences' numbers ("live") and limits; the step's state is a pair (rows, sentences)
    (`step.model_step(compact=True)`).

    Args:
        batch: B.
        limits: (B,) int32 output limits.
        beam_size: K.
        per_sentence: the names of the other modes' loop values of one row per sentence
            (`BeamMode.per_sentence`), dropped with their sentence.
        started: whether some sentences may be done before the first step (the loop's
            "done" given to `beam_search`): they are left out from the start.
    """

    def __init__(self, batch, limits, beam_size, per_sentence=(), started=False):
        super().__init__(batch, limits)
        self.beam_size, self.started = beam_size, started
        self.shrunk = _PER_SENTENCE + tuple(per_sentence)

    def start(self, loop):
        """The sentences' numbers and limits in the loop state, and an output buffer per
        finished pool ("out_...")."""
        loop = dict(loop, live=ops.arange(self.batch, dtype="int32"), limits=self.limits,
                    **{"out_" + name: loop[name] for name in _POOL})
        (row_state, sentences), tokens = loop["state"], loop["tokens"]
        per_sentence, ((row_state, tokens), sentences) = compact_start(
            {name: loop[name] for name in self.shrunk}, ((row_state, tokens), sentences),
            self.beam_size, loop["done"] if self.started else None)
        return dict(loop, **per_sentence, state=(row_state, sentences), tokens=tokens)

    def searching(self, loop):
        return ops.shape(loop["alive_log_probs"])[0], loop["limits"]

    def next(self, loop, step, new, state, parent_rows, next_tokens):
        """The sentences done at this step leave (their pools written to the output buffers),
        the others stay, their beams' rows reordered."""
        row_state, sentences = state
        done = new["done"]
        new.update({name: loop[name] for name in ("live", "limits")})
        stay = ops.nonzero(ops.logical_not(done))[0]
        with keras.name_scope("reorder_caches"):  # only the staying sentences' beams
            rows = ops.reshape(on_rows.take(parent_rows, stay), (-1,))
            row_state = take(row_state, rows)
        tokens = ops.reshape(on_rows.take(next_tokens, stay), (-1,))
        (kept, sentences), buffers = shrink(
            done, ({name: new[name] for name in self.shrunk}, sentences), new["live"],
            tuple((loop["out_" + name], new[name]) for name in _POOL))
        return dict(new, **kept, **dict(zip(("out_" + name for name in _POOL), buffers)),
                    state=(row_state, sentences), tokens=tokens)

    def results(self, final):
        return {name: final["out_" + name] for name in _POOL}
