"""The searches' modes (`decoding.search.modes`): each a small object whose hooks the one step
calls, composed by `beam_search.beam_modes`; the loop's shape, greedy and beam search's alike;
and the search package stays in short functions."""

import ast
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.decoding.search.beam_search import beam_modes, beam_search
from keras_transformer.decoding.search.compact import CompactLoop
from keras_transformer.decoding.search.constraints import ConstraintBanks
from keras_transformer.decoding.search.greedy import greedy_search
from keras_transformer.decoding.search.modes import BeamMode, LoopShape, Selection
from keras_transformer.decoding.search.prefix import PrefixForcing

SEARCH = pathlib.Path(__file__).resolve().parents[1] / "keras_transformer/decoding/search"
LONGEST = 80  # lines, the def line and its docstring included


def test_every_function_of_the_search_package_is_short():
    functions = [(path.name, node.name, node.end_lineno - node.lineno + 1)
                 for path in sorted(SEARCH.glob("*.py"))
                 for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    assert len(functions) > 20, "the check found too few functions"
    assert [f for f in functions if f[2] > LONGEST] == []


def test_the_options_compose_their_modes_in_the_order_the_step_calls_them():
    limits = tf.constant([5, 7])
    plain = beam_modes(2, limits, 4)
    assert type(plain.selection) is Selection and type(plain.shape) is LoopShape
    assert plain.all == (plain.selection, plain.shape)

    prefix, constraints = tf.constant([[5], [0]]), tf.constant(np.full((2, 1, 2), 6, np.int32))
    both = beam_modes(2, limits, 4, prefix=prefix, constraints=constraints)
    assert [type(mode) for mode in both.all] == [PrefixForcing, ConstraintBanks, LoopShape]
    assert all(isinstance(mode, BeamMode) for mode in both.all)
    assert isinstance(beam_modes(2, limits, 4, shape=CompactLoop).shape, CompactLoop)
    with pytest.raises(ValueError, match="compact loop takes no prefix"):
        beam_modes(2, limits, 4, prefix=prefix, shape=CompactLoop)


class _Recording(LoopShape):
    """The plain loop shape, recording which of its hooks a search calls."""

    calls = []

    def start(self, loop):
        self.calls.append("start")
        return super().start(loop)

    def done_after(self, loop, ending):
        self.calls.append("done_after")
        return super().done_after(loop, ending)

    def results(self, final):
        self.calls.append("results")
        return super().results(final)


def _step(tokens, state, index):
    """EOS (2) near-certain from step 2 on, "a" (3) before."""
    probs = tf.where(index >= 2, [0.01, 0.01, 0.96, 0.01, 0.01], [0.01, 0.01, 0.01, 0.96, 0.01])
    return tf.math.log(tf.tile(probs[None, None], [tf.shape(tokens)[0], 1, 1])), state


def test_greedy_and_beam_search_take_the_same_loop_shape():
    limits = tf.constant([9, 9])
    for search in (lambda shape: greedy_search(_step, tf.zeros([2]), limits, shape=shape),
                   lambda shape: beam_search(_step, tf.zeros([4]), limits, beam_size=2,
                                             shape=shape)):
        _Recording.calls.clear()
        found = search(_Recording)
        ids = (found[0] if isinstance(found, tuple) else found["ids"][:, 0]).numpy()
        np.testing.assert_array_equal(ids[:, :3], [[3, 3, 2]] * 2)
        assert _Recording.calls[0] == "start" and _Recording.calls[-1] == "results"
        assert "done_after" in _Recording.calls  # the step asks the shape what is done


def test_the_compact_loop_refuses_what_it_cannot_drop():
    limits, state = tf.constant([9, 9]), (tf.zeros([2]), {"x": tf.zeros([2])})
    with pytest.raises(ValueError, match="compact loop takes no prefix"):
        greedy_search(_step, state, limits, prefix=tf.constant([[3], [0]]), shape=CompactLoop)
    with pytest.raises(ValueError, match="needs one row per sentence, not 2"):
        greedy_search(_step, state, limits, shape=CompactLoop, rows_per_sentence=2)
    with pytest.raises(ValueError, match="needs the cache"):
        CompactLoop.step_state(_step, tf.zeros([2]), None)
