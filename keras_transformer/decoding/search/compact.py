"""Compact search loops: a sentence leaves the loop once it is done, so that a step computes only
the sentences still searching (`CompactLoop`, the loop shape of `beam_search(shape=CompactLoop)`
and `greedy_search(shape=CompactLoop)`).

Where shapes may follow values (TensorFlow's graphs without XLA) a loop variable may change size
from one iteration to the next when its size has no static value. A compact loop keeps, per
sentence still searching, its number in the batch ("live") and whatever the loop reads of it;
the step's state is a pair (rows, sentences) (`CompactLoop.step_state`): the rows of its beams
and what the step reads once per sentence (cross-attention keys and values). At a step where
some sentences are done, their results are written to full-size outputs at their numbers and
every per-sentence tensor keeps the others' rows (`shrink`); the loop ends when none is left.
`default_shape` says which loop a body runs when not told.
"""

import keras
from keras import ops, tree

from keras_transformer.decoding.search.compiling import dynamic_shapes
from keras_transformer.decoding.search.modes import LoopShape
from keras_transformer.layers import rows as on_rows


def default_shape(static, cached, *unsupported):
    """The loop shape a body runs when not told: compact (`CompactLoop`) for a cached search
    whose shapes may follow values (TensorFlow's graphs without XLA), without any of
    `unsupported` (a prefix: None when absent); else every sentence to its end
    (`modes.LoopShape`)."""
    drops = (not static and dynamic_shapes() and cached
             and all(option is None for option in unsupported))
    return CompactLoop if drops else LoopShape


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


class CompactLoop(LoopShape):
    """The compact loop: a sentence leaves once it is done, the search's outputs written to
    full-size buffers ("out_...") as it leaves. The loop state keeps the searching sentences'
    numbers ("live") and limits; the step's state is a pair (rows, sentences).

    Args: as for `LoopShape`; every loop value named in `per_sentence` and `per_row` is
    dropped with its sentence, the `outputs` among them written out. Refused: a `prefix`
    (its tokens are not loop values the loop drops) and `per_row` values with more than one
    row per sentence (the loop drops whole sentences).
    """

    def __init__(self, batch, limits, rows_per_sentence=1, per_sentence=(), outputs=(),
                 per_row=(), prefix=None, started=False):
        if prefix is not None:
            raise ValueError("a compact loop takes no prefix (a prefix's tokens are not loop "
                             "values the loop drops): search with modes.LoopShape.")
        one = isinstance(rows_per_sentence, int) and rows_per_sentence == 1
        if per_row and not one:
            raise ValueError(f"a compact loop drops whole sentences: a search of loop values "
                             f"per row ({', '.join(per_row)}) needs one row per sentence, not "
                             f"{rows_per_sentence}.")
        super().__init__(batch, limits)
        self.rows_per_sentence, self.started, self.outputs = rows_per_sentence, started, outputs
        self.shrunk = tuple(per_sentence) + tuple(per_row) + ("live", "limits")

    @staticmethod
    def step_state(step_fn, rows, sentences):
        """`step_fn` as it is, and the pair (rows, sentences) as the state, both dropped with
        their sentences."""
        if sentences is None:
            raise ValueError("a compact search needs the cache (cached=True).")
        return step_fn, (rows, sentences)

    def start(self, loop):
        """The sentences' numbers and limits in the loop state, and an output buffer per
        output ("out_..."); the sentences done already (`started`) left out."""
        loop = dict(loop, live=ops.arange(self.batch, dtype="int32"), limits=self.limits,
                    **{"out_" + name: loop[name] for name in self.outputs})
        (row_state, sentences), tokens = loop["state"], loop["tokens"]
        per_sentence, ((row_state, tokens), sentences) = compact_start(
            {name: loop[name] for name in self.shrunk}, ((row_state, tokens), sentences),
            self.rows_per_sentence, loop["done"] if self.started else None)
        return dict(loop, **per_sentence, state=(row_state, sentences), tokens=tokens)

    def searching(self, loop):
        return ops.shape(loop["live"])[0], self.limits_of(loop)

    def limits_of(self, loop):
        return loop["limits"]

    def unless_done(self, loop, values, fill):
        return values  # a done sentence has left the loop

    def done_after(self, loop, ending):
        return ending  # those done before have left

    def next(self, loop, step, new, state, parent_rows, next_tokens):
        """The sentences done at this step leave (their outputs written out), the others
        stay, their beams' rows reordered."""
        row_state, sentences = state
        stay = ops.nonzero(ops.logical_not(new["done"]))[0]
        with keras.name_scope("reorder_caches"):  # only the staying sentences' beams
            rows = ops.reshape(on_rows.take(parent_rows, stay), (-1,))
            row_state = take(row_state, rows)
        tokens = ops.reshape(on_rows.take(next_tokens, stay), (-1,))
        new, sentences = self._leave(loop, new, sentences)
        return dict(new, state=(row_state, sentences), tokens=tokens)

    def stay(self, loop, new, state, next_tokens):
        """The sentences done at this step leave (their outputs written out), the others'
        rows stay as they are (one row per sentence)."""
        row_state, sentences = state
        new, (row_state, tokens, sentences) = self._leave(
            loop, new, (row_state, next_tokens, sentences))
        return dict(new, state=(row_state, sentences), tokens=tokens)

    def _leave(self, loop, new, others):
        """(the next loop values `new` without the sentences done at this step, their
        outputs written out; the nest `others` without their rows)."""
        new.update({name: loop[name] for name in ("live", "limits")})
        (kept, others), buffers = shrink(
            new["done"], ({name: new[name] for name in self.shrunk}, others), new["live"],
            tuple((loop["out_" + name], new[name]) for name in self.outputs))
        return dict(new, **kept, **dict(zip(("out_" + name for name in self.outputs),
                                            buffers))), others

    def results(self, final):
        return {name: final["out_" + name] for name in self.outputs}
