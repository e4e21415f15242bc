"""Beam search's modes (`decoding.search.modes`): each a small object whose hooks the one step
calls, composed by `beam_search.beam_modes`; and the search package stays in short functions."""

import ast
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.decoding.search.beam_search import beam_modes
from keras_transformer.decoding.search.compact import CompactLoop
from keras_transformer.decoding.search.constraints import ConstraintBanks
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
