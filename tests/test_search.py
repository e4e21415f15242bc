import ast
import math
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.decoding.request import DEFAULTS
from keras_transformer.decoding.search.beam_search import (
    beam_search,
    compiled_beam_search,
    length_penalty,
    translate_beam,
)
from keras_transformer.decoding.search.rules import NEG_INF, eos_for_empty_rows, trim
from keras_transformer.decoding.search.greedy import (
    compiled_greedy_search,
    greedy_search,
    translate_greedy,
)
from keras_transformer.decoding.search.step import model_step
from pipelines.special_ids import EOS_ID
from tests.search_helpers import source_rows, tiny_model

VOCAB = 40


@pytest.fixture(scope="module")
def model():
    return tiny_model(VOCAB)


# The searches several tests run, each traced once for the file (a compiled search traces once
# for every batch shape: test_search_traces_once_for_many_batch_shapes).
@pytest.fixture(scope="module")
def greedy(model):
    return compiled_greedy_search(model)


@pytest.fixture(scope="module")
def beam(model):
    return compiled_beam_search(model, 4, 0.6)


def sources(seed=0, rows=3, width=7):
    return source_rows(VOCAB, seed, rows, width)


def hypotheses(ids):
    """Rows of ids up to and including EOS, as tuples."""
    out = []
    for row in np.asarray(ids):
        row = list(row)
        out.append(tuple(row[: row.index(EOS_ID) + 1]) if EOS_ID in row else tuple(row))
    return out


@pytest.mark.slow  # traces the beam search in a graph
def test_beam_size_1_equals_greedy(model, greedy):
    # With alpha = 0 beam search of width 1 follows greedy's choices; with alpha > 0 it may
    # legitimately keep going to find a longer, better-normalized hypothesis. Its two
    # candidates a step (2 x beam_size) also put an EOS that was second best into its
    # finished pool: where greedy runs on and ends lower (a stutter to the length limit),
    # the beam returns that earlier end, greedy's own prefix and EOS, of a higher score.
    src = sources()
    greedy_ids, greedy_scores = greedy(src)
    # translate_beam inside a graph (eagerly it runs the same ops, one Python step at a time).
    beam = tf.function(lambda ids: translate_beam(model, ids, beam_size=1, alpha=0.0))(src)
    beam_scores = np.asarray(beam["log_probs"][:, 0])
    same = 0
    for ours, theirs, score, greedy_score in zip(hypotheses(beam["ids"][:, 0]),
                                                 hypotheses(greedy_ids), beam_scores,
                                                 np.asarray(greedy_scores)):
        if ours == theirs:
            np.testing.assert_allclose(score, greedy_score, rtol=1e-5, atol=1e-5)
            same += 1
        else:
            assert ours[-1] == EOS_ID and ours[:-1] == theirs[:len(ours) - 1]
            assert score > greedy_score
    assert same >= 2  # (3 sources)


@pytest.mark.parametrize("beam_size", [1, pytest.param(4, marks=pytest.mark.slow)])
def test_cached_and_uncached_decoding_agree(model, greedy, beam, beam_size):
    src = sources(seed=1)  # greedy and beam are the cached searches
    if beam_size == 1:
        cached = greedy(src)[0]
        uncached = compiled_greedy_search(model, cached=False)(src)[0]
        assert hypotheses(cached) == hypotheses(uncached)
        return
    cached = beam(src)
    uncached = compiled_beam_search(model, beam_size, cached=False)(src)
    for k in range(beam_size):
        assert hypotheses(cached["ids"][:, k]) == hypotheses(uncached["ids"][:, k])
    np.testing.assert_allclose(cached["scores"], uncached["scores"], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_a_batch_decodes_like_its_sentences_one_by_one(beam):
    src = sources(seed=2, rows=4, width=9)
    batch = beam(src)
    for row in range(len(src)):
        alone = src[row: row + 1]
        alone = alone[:, : int(np.count_nonzero(alone))]  # no padding at all
        single = beam(alone)
        assert hypotheses(single["ids"][:, 0]) == hypotheses(batch["ids"][row: row + 1, 0])
        np.testing.assert_allclose(single["scores"][0], batch["scores"][row], atol=1e-4)


@pytest.mark.slow
def test_search_traces_once_for_many_batch_shapes(greedy, beam):
    # The file's shared searches: whatever shapes the other tests gave them before, every
    # call below still runs on their one trace.
    for i in range(10):
        src = sources(seed=i, rows=1 + i % 4, width=3 + i)
        beam(src)
        greedy(src)
    assert beam.experimental_get_tracing_count() == 1
    assert greedy.experimental_get_tracing_count() == 1


# A constructed model: next-token probabilities depend only on the position, so every
# hypothesis' probability can be computed by hand. Tokens: 0 PAD, 1 BOS, 2 EOS, 3 "a", 4 "b".
TABLE = {0: {EOS_ID: 0.45, 3: 0.55}, 1: {3: 0.9, EOS_ID: 0.1}, 2: {3: 0.9, EOS_ID: 0.1},
         3: {EOS_ID: 0.9, 3: 0.1}}


def table_step(calls):
    def step(tokens, state, index):
        calls.append(int(index))
        probs = np.full(5, 1e-6)
        for token, p in TABLE.get(int(index), {EOS_ID: 0.99}).items():
            probs[token] = p
        logits = tf.math.log(tf.constant(probs / probs.sum(), tf.float32))
        rows = tf.shape(tokens)[0]
        return tf.tile(logits[None, None], [rows, 1, 1]), state + 1

    return step


def run_table(alpha, beam_size=2, limit=20, stop_horizon=DEFAULTS["stop_horizon"]):
    calls = []
    result = beam_search(table_step(calls), tf.zeros([beam_size], tf.int32),
                         tf.constant([limit]), beam_size=beam_size, alpha=alpha,
                         stop_horizon=stop_horizon)
    return [h for h in hypotheses(result["ids"][:, 0])][0], result, calls


def test_length_penalty_prefers_the_longer_hypothesis_as_specified():
    assert float(length_penalty(1, 0.6)) == pytest.approx(1.0)
    assert float(length_penalty(4, 0.6)) == pytest.approx((9 / 6) ** 0.6)
    short, _, _ = run_table(alpha=0.0)
    assert short == (EOS_ID,)  # log 0.45 beats log(0.55 * 0.9 * 0.9 * 0.9) = log 0.401
    long, result, _ = run_table(alpha=0.6)
    assert long == (3, 3, 3, EOS_ID)
    expected = math.log(0.55 * 0.9 * 0.9 * 0.9) / ((5 + 4) / 6) ** 0.6
    assert float(result["scores"][0, 0]) == pytest.approx(expected, rel=1e-3)
    assert float(result["scores"][0, 1]) < float(result["scores"][0, 0])  # pool is sorted


def test_early_termination_stops_when_no_alive_hypothesis_can_win():
    global TABLE
    saved = TABLE
    try:
        TABLE = {0: {EOS_ID: 0.9, 3: 0.05, 4: 0.05}}
        best, _, calls = run_table(alpha=0.0, limit=30)
        assert best == (EOS_ID,)
        # After step 0 the finished "EOS" (log 0.9) beats every alive beam (log 0.05 at most).
        assert calls == [0]
        # Closer call: "a" (log 0.45) loses to "EOS" (log 0.5) now, but divided by the largest
        # penalty it could reach, ((5 + 30) / 6) ** 0.6, it might still win: search goes on,
        # then stops once "a EOS" is finished and nothing alive can beat the pool.
        TABLE = {0: {EOS_ID: 0.5, 3: 0.45, 4: 0.05}}
        best, _, calls = run_table(alpha=0.6, limit=30)
        assert calls == [0, 1]
        assert best == (EOS_ID,)  # log 0.5 = -0.69 beats log(0.45 * 0.99) / 1.097 = -0.74
    finally:
        TABLE = saved


def test_the_stop_horizon_looks_that_many_steps_ahead():
    """After step 0 "EOS" (log 0.6 = -0.51) is finished and "a" (log 0.4 = -0.92) alive; "a"
    x 5 + EOS (log 0.4: the table's later tokens are all but certain) ends at length 6, where
    the penalty ((5 + 6) / 6) ** 2 = 3.36 makes it -0.27: the best. Ending at the next step
    (horizon 1, penalty 1.36), "a" could reach -0.67 at best, so the sentence stops there with
    "EOS"; within 3 steps (penalty 2.25) it could reach -0.41 and the search goes on, as the
    exact rule (0) does."""
    global TABLE
    saved = TABLE
    try:
        TABLE = {0: {EOS_ID: 0.6, 3: 0.4}, **{i: {3: 0.99} for i in range(1, 5)}}
        best, _, calls = run_table(alpha=2.0, limit=30, stop_horizon=1)
        assert (best, calls) == ((EOS_ID,), [0])
        exact, result, exact_calls = run_table(alpha=2.0, limit=30, stop_horizon=0)
        assert exact == (3, 3, 3, 3, 3, EOS_ID)
        assert float(result["scores"][0, 0]) == pytest.approx(
            math.log(0.4) / (11 / 6) ** 2, rel=1e-3)
        horizon, _, calls = run_table(alpha=2.0, limit=30)  # the default, 3
        assert horizon == exact and len(calls) <= len(exact_calls)
    finally:
        TABLE = saved


@pytest.mark.slow
def test_outputs_stop_at_input_length_plus_50(model):
    src = sources(seed=3, rows=2, width=4)
    step_fn, state, limits, steps = model_step(model, src, beam_size=2)
    assert list(limits.numpy()) == [4 + 50, 3 + 50]
    ids, _ = greedy_search(*model_step(model, src)[:3], min_length=60)
    # EOS is forced at each sentence's limit even when a longer output is asked for.
    assert [len(h) for h in hypotheses(ids)] == [54, 53]


@pytest.mark.slow
def test_xla_compiled_search_equals_the_plain_graph(model, greedy, beam):
    """The XLA form (static cache and output lengths: padded width + extra_length) finds the
    same hypotheses with the same scores as the plain graph, padded inputs included."""
    src = np.pad(sources(seed=3, rows=3, width=8), [[0, 0], [0, 8]])  # padded like Translator
    plain, xla = beam, compiled_beam_search(model, 4, jit_compile=True)
    expected, found = plain(src), xla(src)
    for k in range(4):
        assert hypotheses(found["ids"][:, k]) == hypotheses(expected["ids"][:, k])
    np.testing.assert_allclose(found["scores"], expected["scores"], rtol=1e-4, atol=1e-4)
    greedy_ids, greedy_scores = greedy(src)
    xla_ids, xla_scores = compiled_greedy_search(model, jit_compile=True)(src)
    assert hypotheses(xla_ids) == hypotheses(greedy_ids)
    assert xla_ids.shape[1] == greedy_ids.shape[1]  # padding columns trimmed as before
    np.testing.assert_allclose(xla_scores, greedy_scores, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_static_shapes_find_what_dynamic_shapes_find(model, greedy, beam):
    """The static form that JAX compiles (cache and buffer of padded width + 50, trimmed
    afterwards on the host) finds the same hypotheses and scores as TensorFlow's dynamic one."""
    src = np.pad(sources(seed=4), [[0, 0], [0, 5]])

    @tf.function
    def static(source_ids):
        return (translate_beam(model, source_ids, 4, 0.6, static=True),
                translate_greedy(model, source_ids, static=True))

    result, static_greedy = static(src)
    assert result["ids"].shape[-1] == static_greedy["ids"].shape[-1] == src.shape[1] + 50
    expected = beam(src)  # compiled_beam_search(model, 4, alpha=0.6)
    np.testing.assert_array_equal(trim(result["ids"].numpy()), expected["ids"].numpy())
    np.testing.assert_allclose(result["scores"], expected["scores"], rtol=1e-5, atol=1e-5)
    expected_ids, expected_scores = greedy(src)
    np.testing.assert_array_equal(trim(static_greedy["ids"][:, 0].numpy()), expected_ids.numpy())
    np.testing.assert_allclose(static_greedy["scores"][:, 0], expected_scores, rtol=1e-5,
                               atol=1e-5)


def test_empty_rows_get_eos_alone_first_and_nothing_after():
    result = {"ids": tf.constant([[[5, 6, 2], [5, 2, 0]], [[7, 2, 0], [8, 9, 2]]]),
              "scores": tf.constant([[-1.0, -2.0], [-3.0, -4.0]]),
              "log_probs": tf.constant([[-1.5, -2.5], [-3.5, -4.5]])}
    out = eos_for_empty_rows(result, tf.constant([False, True]))
    np.testing.assert_array_equal(out["ids"], [[[5, 6, 2], [5, 2, 0]], [[2, 0, 0], [0, 0, 0]]])
    for key in ("scores", "log_probs"):
        np.testing.assert_array_equal(out[key][0], result[key][0])
        np.testing.assert_array_equal(out[key][1], [0.0, NEG_INF])
    # A search of 0 columns still gets one, for the EOS.
    none = eos_for_empty_rows({"ids": tf.zeros([1, 1, 0], tf.int32),
                               "scores": tf.zeros([1, 1])}, tf.constant([True]))
    np.testing.assert_array_equal(none["ids"], [[[EOS_ID]]])


ROOT = pathlib.Path(__file__).resolve().parents[1]
# What the search bodies are made of: callers outside decoding/ use the bodies instead.
SEARCH_INTERNALS = {"NEG_INF", "tile_beams", "static_max_length", "model_step", "prefixed_step",
                    "pick_search", "greedy_search", "beam_search", "prefix_forcing",
                    "mask_special_tokens", "output_limits", "finish", "with_optional_prefix",
                    "RandomSampler", "token_log_probs"}


def python_files(*folders):
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def test_only_decoding_runs_the_search_loops():
    calls = []
    for path in python_files("keras_transformer", "benchmarks"):
        if "decoding" in path.relative_to(ROOT).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                if name in ("beam_search", "greedy_search"):
                    calls.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}(")
    assert not calls, calls


def test_export_imports_only_public_names_of_decoding():
    imported = []
    for path in python_files("keras_transformer/export"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "keras_transformer.decoding"):
                imported += [(path.name, alias.name) for alias in node.names]
    assert imported, "the check found no import at all"
    internal = [(file, name) for file, name in imported
                if name.startswith("_") or name in SEARCH_INTERNALS]
    assert not internal, internal


def test_trim_drops_the_trailing_padding_columns_of_tensors_and_arrays():
    ids = np.array([[[5, 2, 0, 0, 0]], [[6, 7, 2, 0, 0]]], "int32")  # (B, K, T)
    for trimmed in (trim(ids), trim(tf.constant(ids)).numpy()):
        np.testing.assert_array_equal(trimmed, ids[..., :3])
    for empty in (np.zeros((2, 0), "int32"), np.zeros((0, 4), "int32"), np.zeros((2, 4), "int32")):
        assert trim(empty).shape == (empty.shape[0], 0)
        assert tuple(trim(tf.constant(empty)).shape) == (empty.shape[0], 0)


def test_greedy_takes_the_first_of_equally_likely_tokens():
    def step(tokens, state, index):
        logits = tf.constant([0.0, 0.0, -5.0, 1.0, 1.0], tf.float32)  # "a" (3) ties with "b" (4)
        return tf.tile(logits[None, None], [tf.shape(tokens)[0], 1, 1]), state

    ids, scores = greedy_search(step, tf.zeros([2]), tf.constant([3, 2]))
    assert hypotheses(ids) == [(3, 3, EOS_ID), (3, EOS_ID)]
    logits = np.array([0.0, 0.0, -5.0, 1.0, 1.0])
    log_probs = logits - np.log(np.exp(logits).sum())  # EOS is forced at each limit
    np.testing.assert_allclose(scores, [2 * log_probs[3] + log_probs[2],
                                        log_probs[3] + log_probs[2]], rtol=1e-5)


def _graph_op_types(function):
    """Every op type of a traced tf.function, the loop bodies' included."""
    graph = function.get_concrete_function().graph.as_graph_def()
    return ({node.op for node in graph.node}
            | {node.op for body in graph.library.function for node in body.node_def})


@pytest.mark.slow  # traces the beam search twice
def test_the_graph_search_grows_its_caches_and_a_static_one_keeps_them(model):
    spec = [tf.TensorSpec([None, None], tf.int32)]
    growing = tf.function(lambda s: translate_beam(model, s, 2)["ids"], input_signature=spec)
    fixed = tf.function(lambda s: translate_beam(model, s, 2, static=True)["ids"],
                        input_signature=spec)
    # A fixed cache is written in place at the step's index; a growing one is appended to.
    assert "XlaDynamicUpdateSlice" not in _graph_op_types(growing)
    assert "XlaDynamicUpdateSlice" in _graph_op_types(fixed)
    source = sources()
    np.testing.assert_array_equal(growing(source).numpy(),
                                  fixed(source).numpy()[:, :, :growing(source).shape[2]])
