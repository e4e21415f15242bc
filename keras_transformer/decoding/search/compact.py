"""Compact search loops: a sentence leaves the loop once it is done, so that a step computes only
the sentences still searching (`beam_search(compact=True)`, `greedy_search(compact=True)`).

Where shapes may follow values (TensorFlow's graphs without XLA) a loop variable may change size
from one iteration to the next when its size has no static value. A compact loop keeps, per
sentence still searching, its number in the batch ("live") and whatever the loop reads of it;
the step's state is a pair (rows, sentences) (`step.model_step(compact=True)`): the rows of its
beams and what the step reads once per sentence (cross-attention keys and values). At a step
where some sentences are done, their results are written to full-size outputs at their numbers
and every per-sentence tensor keeps the others' rows (`shrink`); the loop ends when none is left.
"""

from keras import ops, tree

from keras_transformer.decoding.search.compiling import dynamic_shapes
from keras_transformer.layers import rows as on_rows


def by_default(static, cached, *unsupported):
    """Whether a body compacts its loop when not told: a cached search whose shapes may
    follow values (TensorFlow's graphs without XLA), without any of `unsupported` (a
    prefix, constraints: None when absent)."""
    return (not static and dynamic_shapes() and cached
            and all(option is None for option in unsupported))


def compact_start(per_sentence, state, rows_per_sentence):
    """The loop's first values: `per_sentence` (a nest of (B, ...) tensors) and `state` (rows
    (B x R, ...), sentences (B, ...)) as they are where the batch size has no static value (a
    graph traced for any batch), else taken through a gather of no static size (a graph traced
    for one batch size, or eager: a loop variable of static size may not change size)."""
    first = tree.flatten(per_sentence)[0]
    if not isinstance(ops.shape(first)[0], int):
        return per_sentence, state
    live = ops.nonzero(ops.greater_equal(ops.arange(ops.shape(first)[0]), 0))[0]
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
