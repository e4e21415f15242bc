"""The repetition controls (`decoding.search.repetition`): the n-gram ban and the sign-aware
penalty on hand-made tokens and logits, in greedy search and in every mode of beam search
(prefix, constraints, compact), the same under XLA and JAX, refused by name out of range, and
nothing built for them when off."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_transformer.decoding.request import Request, check
from keras_transformer.decoding.search.beam_search import beam_search, compiled_beam_search
from keras_transformer.decoding.search.greedy import compiled_greedy_search, greedy_search
from keras_transformer.decoding.search.repetition import (
    Repetition, generated, penalized, repeated_ngrams, repetition)
from keras_transformer.decoding.search.rules import NEG_INF
from keras_transformer.errors import InputError
from pipelines.special_ids import EOS_ID
from tests.conftest import run_engine
from tests.search_helpers import source_rows, tiny_model

VOCAB = 40


def repeats(row, n):
    """How many n-grams of a row's tokens (special ones left out) repeat an earlier one."""
    tokens = [int(t) for t in row if t > EOS_ID]
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) - len(set(grams))


def test_a_token_that_would_repeat_an_ngram_is_banned():
    tokens = np.array([[5, 6, 7, 5, 6, 0, 0], [5, 5, 5, 5, 0, 0, 0]], np.int32)
    banned = lambda length, n: np.flatnonzero(  # noqa: E731
        np.asarray(repeated_ngrams(tokens, length, n, 10))[0]).tolist()
    assert banned(5, 2) == [7]  # "6 7" was written: after the last 6, 7 would repeat it
    assert banned(5, 3) == [7]  # "5 6 7"
    assert banned(4, 2) == [6]  # after "5 6 7 5": "5 6"
    assert banned(5, 4) == []  # "7 5 6" never came before
    assert banned(5, 1) == [5, 6, 7]  # n = 1: every token written
    assert banned(5, 0) == []  # off
    assert banned(1, 2) == []  # too few tokens for a bigram to repeat
    # Only the first `length` tokens count (the buffer's padding never does).
    assert np.flatnonzero(np.asarray(repeated_ngrams(tokens, 4, 2, 10))[1]).tolist() == [5]
    assert np.flatnonzero(np.asarray(generated(tokens, 3, 10))[0]).tolist() == [5, 6, 7]


def test_the_penalty_divides_positive_logits_and_multiplies_negative_ones():
    logits = np.array([[2.0, -2.0, 0.0, 1.0, -1.0]], np.float32)
    seen = np.array([[True, True, True, False, False]])
    assert np.asarray(penalized(logits, seen, 2.0)).tolist() == [[1.0, -4.0, 0.0, 1.0, -1.0]]
    # As a search applies it: on the logits of the tokens generated so far, before the softmax.
    tokens = np.array([[0, 1, 2, 0]], np.int32)
    controls = Repetition(repetition_penalty=2.0)
    np.testing.assert_allclose(controls.logits(logits, lambda: (tokens, 3)),
                               [[1.0, -4.0, 0.0, 1.0, -1.0]])
    np.testing.assert_allclose(controls.logits(logits, lambda: (tokens, 1)),
                               [[1.0, -2.0, 0.0, 1.0, -1.0]])
    # A penalty below 1 favours repeats (the same rule).
    np.testing.assert_allclose(penalized(logits, seen, 0.5), [[4.0, -1.0, 0.0, 1.0, -1.0]])
    # As scalar tensors (a signature's inputs): the rule under a cond, the same values.
    tensor = Repetition(tf.constant(2), tf.constant(2.0))
    np.testing.assert_allclose(tensor.logits(logits, lambda: (tokens, 3)),
                               [[1.0, -4.0, 0.0, 1.0, -1.0]])
    off = Repetition(tf.constant(0), tf.constant(1.0))
    np.testing.assert_allclose(off.logits(logits, lambda: (tokens, 3)), logits)
    np.testing.assert_allclose(off.log_probs(logits, lambda: (tokens, 3)), logits)


def test_the_controls_are_nothing_at_their_defaults():
    assert repetition() is None and repetition(0, 1.0) is None and repetition(0, 1) is None
    assert repetition(np.int32(0), np.float32(1.0)) is None
    assert repetition(3).penalty is None and repetition(3).ngram_size == 3
    assert repetition(repetition_penalty=1.2).ngram_size is None
    both = repetition(tf.constant(0), tf.constant(1.0))  # tensors: decided in the graph
    assert both is not None


def _fixed_step(preferences, vocab=12):
    """A step function whose logits are the same at every step: `preferences` {token: logit},
    every other token -5 (EOS included)."""
    row = np.full((vocab,), -5.0, np.float32)
    for token, logit in preferences.items():
        row[token] = logit

    def step_fn(tokens, state, index):
        return ops.tile(ops.convert_to_tensor(row)[None, None, :], (ops.shape(tokens)[0], 1, 1)), \
            state

    return step_fn


def test_greedy_search_bans_the_repeats_and_penalizes_as_the_rule_says():
    step_fn = _fixed_step({5: 3.0, 6: 2.0, 7: 1.0})
    limits = tf.constant([9])
    ids, _ = greedy_search(step_fn, tf.zeros((1, 1)), limits)
    assert ids.numpy()[0].tolist() == [5] * 8 + [EOS_ID]  # "Nummer 55555555"
    ids, _ = greedy_search(step_fn, tf.zeros((1, 1)), limits, controls=repetition(2))
    row = ids.numpy()[0].tolist()
    assert row[:5] == [5, 5, 6, 5, 7] and repeats(row, 2) == 0
    # The penalty: after "5", 5's logit 3 becomes 3 / 4 < 2: 6 next, then 7 (3/4, 2/4, 1/4 all
    # seen: 5 is the best again); the score is the log-probability of the penalized logits.
    ids, score = greedy_search(step_fn, tf.zeros((1, 1)), tf.constant([4]),
                               controls=repetition(repetition_penalty=4.0))
    assert ids.numpy()[0].tolist() == [5, 6, 7, EOS_ID]
    logits = np.full((12,), -5.0)
    logits[[5, 6, 7]] = [3.0, 2.0, 1.0]
    expected = 0.0  # EOS is forced at the limit; PAD and BOS are banned after the softmax
    for token, seen in [(5, []), (6, [5]), (7, [5, 6]), (EOS_ID, [5, 6, 7])]:
        z = logits.copy()
        z[seen] = np.where(z[seen] < 0, z[seen] * 4.0, z[seen] / 4.0)
        expected += z[token] - np.log(np.sum(np.exp(z)))
    np.testing.assert_allclose(score.numpy()[0], expected, rtol=1e-5)


def test_beam_search_bans_the_repeats_in_every_hypothesis():
    step_fn = _fixed_step({5: 3.0, 6: 2.9, 7: 2.8, 8: 2.7})
    limits = tf.constant([10, 7])
    state = tf.zeros((8, 1))
    plain = beam_search(step_fn, state, limits, beam_size=4, alpha=0.6)
    assert max(repeats(row, 2) for row in plain["ids"].numpy().reshape(8, -1)) > 0
    found = beam_search(step_fn, state, limits, beam_size=4, alpha=0.6, no_repeat_ngram_size=2)
    hypotheses = found["ids"].numpy().reshape(8, -1)
    assert [repeats(row, 2) for row in hypotheses] == [0] * 8
    assert (found["scores"].numpy() > NEG_INF / 2).all()


@pytest.fixture(scope="module")
def model():
    return tiny_model(VOCAB)


@pytest.fixture(scope="module")
def sources():
    return source_rows(VOCAB, rows=4, width=9)


CONTROLS = dict(no_repeat_ngram_size=2, repetition_penalty=1.3)


class Searches:
    """The searches of `model` (beam 4 and alpha 0.6, or greedy), each built once for the
    module and its outputs on `sources` found once: the tests that ask for the same search
    share one trace (and its first run) instead of tracing it again."""

    def __init__(self, model, sources):
        self.model, self.sources, self.built, self.outputs = model, sources, {}, {}

    @staticmethod
    def _key(kind, options):
        return kind, tuple(sorted(options.items()))

    def search(self, kind, **options):
        """compiled_beam_search(model, 4, 0.6, **options) or compiled_greedy_search(model,
        **options), built on first use."""
        key = self._key(kind, options)
        if key not in self.built:
            self.built[key] = (compiled_greedy_search(self.model, **options) if kind == "greedy"
                               else compiled_beam_search(self.model, 4, 0.6, **options))
        return self.built[key]

    def run(self, kind, **options):
        """That search's outputs on `sources`."""
        key = self._key(kind, options)
        if key not in self.outputs:
            self.outputs[key] = self.search(kind, **options)(self.sources)
        return self.outputs[key]


@pytest.fixture(scope="module")
def searches(model, sources):
    return Searches(model, sources)


def _best(outputs):
    ids = outputs["ids"] if isinstance(outputs, dict) else outputs[0]
    ids = np.asarray(ids)
    return ids[:, 0] if ids.ndim == 3 else ids


def test_the_random_model_stutters_and_the_controls_stop_it(searches):
    """An untrained model repeats one token ("Gestestestest"); both searches, compact (the
    default on TensorFlow's graphs) and not, stop it with the n-gram rule."""
    for kind in ("beam", "greedy"):
        assert max(repeats(row, 2) for row in _best(searches.run(kind))) > 3
    for kind, options in (("beam", CONTROLS), ("greedy", CONTROLS),
                          ("beam", dict(no_repeat_ngram_size=1))):
        assert [repeats(row, 2) for row in _best(searches.run(kind, **options))] == [0] * 4
    penalized_only = searches.run("beam", repetition_penalty=3.0)
    assert not np.array_equal(_best(penalized_only), _best(searches.run("beam")))


@pytest.mark.slow  # two XLA compilations
def test_xla_gives_the_graphs_outputs_with_the_controls_on(searches):
    for kind in ("beam", "greedy"):
        graph = searches.run(kind, **CONTROLS)
        xla = searches.run(kind, jit_compile=True, **CONTROLS)
        np.testing.assert_array_equal(_best(xla), _best(graph))
        scores = (lambda o: np.asarray(o["scores"] if isinstance(o, dict) else o[1]))
        np.testing.assert_allclose(scores(xla), scores(graph), atol=1e-4)


def test_a_prefix_that_repeats_an_ngram_is_still_written(searches, sources):
    prefix = np.zeros((4, 4), np.int32)
    prefix[0] = [9, 10, 9, 10]  # a repeated bigram in the prefix itself
    prefix[2, :2] = [11, 11]
    for search in (searches.search("beam", with_prefix=True, **CONTROLS),
                   searches.search("greedy", with_prefix=True, **CONTROLS)):
        outputs = search(sources, prefix)
        best = _best(outputs)
        assert best[0, :4].tolist() == [9, 10, 9, 10] and best[2, :2].tolist() == [11, 11]
        scores = np.asarray(outputs["scores"] if isinstance(outputs, dict) else outputs[1])
        assert (np.reshape(scores, (4, -1))[:, 0] > NEG_INF / 2).all()
        assert [repeats(row, 2) for row in best[[1, 3]]] == [0, 0]  # no prefix there


def test_a_constraint_whose_phrase_repeats_a_bigram_is_still_met(searches, sources):
    constraints = np.zeros((4, 2, 4), np.int32)
    constraints[0, 0] = [9, 10, 9, 10]  # the phrase repeats the bigram "9 10"
    constraints[1, 0, :3] = [12, 12, 12]
    constraints[1, 1, :2] = [13, 14]
    search = searches.search("beam", with_constraints=True, **CONTROLS)
    outputs = search(sources, constraints)
    for row, phrases in zip(np.asarray(outputs["ids"])[:, 0], constraints):
        tokens = [int(t) for t in row]
        for phrase in phrases:
            phrase = [int(t) for t in phrase if t]
            if phrase:
                assert any(tokens[i:i + len(phrase)] == phrase for i in range(len(tokens))), \
                    (tokens, phrase)
    assert (np.asarray(outputs["scores"])[:, 0] > -1e5).all()  # met, not forced to end
    # Rows without phrases: no repeated bigram.
    assert [repeats(row, 2) for row in np.asarray(outputs["ids"])[2:, 0]] == [0, 0]


def test_hostile_values_are_refused_by_name():
    for values, said in [(dict(no_repeat_ngram_size=-1), "no_repeat_ngram_size=-1 must be at "
                                                         "least 0"),
                         (dict(repetition_penalty=0.0), "repetition_penalty=0.0 must be above 0"),
                         (dict(repetition_penalty=-1.5), "repetition_penalty=-1.5 must be above"),
                         (dict(repetition_penalty=float("nan")), "repetition_penalty=nan"),
                         (dict(repetition_penalty="2"), "repetition_penalty='2' must be a number"),
                         (dict(no_repeat_ngram_size=2.5), "no_repeat_ngram_size=2.5 must be an "
                                                          "integer"),
                         (dict(no_repeat_ngram_size=True), "no_repeat_ngram_size=True must be")]:
        with pytest.raises(InputError, match=said.replace("(", r"\(")):
            Request(**values)
    with pytest.raises(InputError, match="--no-repeat-ngram-size -2 must be at least 0"):
        check({"no_repeat_ngram_size": -2}, flags=True)
    request = Request(no_repeat_ngram_size=3, repetition_penalty=2)
    assert request.repetition_penalty == 2.0 and isinstance(request.repetition_penalty, float)
    assert request.engine_options() == {"no_repeat_ngram_size": 3, "repetition_penalty": 2.0}
    # Off, a request asks nothing of an engine and records nothing new.
    assert "no_repeat_ngram_size" not in Request().recorded()
    assert Request().engine_options() == {}


def test_off_the_searches_build_the_graphs_they_built_before(searches):
    """With the controls at their defaults, the traced searches hold the same nodes as with
    no controls at all (nothing is built for them); on, they hold more. (The searches the
    other tests ran are traced once, by their input signature: the same graphs.)"""
    def nodes(search):
        graph = search.get_concrete_function().graph.as_graph_def()
        return len(graph.node) + sum(len(f.node_def) for f in graph.library.function)

    for build in (lambda **kw: searches.search("beam", **kw),
                  lambda **kw: searches.search("beam", with_constraints=True, **kw),
                  lambda **kw: searches.search("greedy", **kw)):
        off = nodes(build(no_repeat_ngram_size=0, repetition_penalty=1.0))
        assert off == nodes(build())
        assert nodes(build(**CONTROLS)) > off


JAX_SCRIPT = """
import json, sys
import numpy as np
from keras_transformer import Transformer
from keras_transformer.decoding.search.beam_search import compiled_beam_search
from keras_transformer.decoding.search.greedy import compiled_greedy_search

model = Transformer.from_preset("tiny", vocab_size={vocab}, dropout=0.0, num_layers={layers})
model.build()
model.load_weights(sys.argv[1])
sources = np.load(sys.argv[2])
controls = {controls}
out = {{}}
for name, search in [("beam", compiled_beam_search(model, 4, 0.6, **controls)),
                     ("greedy", compiled_greedy_search(model, **controls))]:
    found = search(sources)
    ids = found["ids"] if isinstance(found, dict) else found[0]
    scores = found["scores"] if isinstance(found, dict) else found[1]
    out[name] = [np.asarray(ids).tolist(), np.asarray(scores).tolist()]
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")
def test_jax_gives_tensorflows_outputs_with_the_controls_on(model, sources, searches,
                                                          tmp_path):
    weights, rows = tmp_path / "tiny.weights.h5", tmp_path / "sources.npy"
    model.save_weights(weights)
    np.save(rows, sources)
    script = JAX_SCRIPT.format(vocab=VOCAB, layers=model.architecture["num_layers"],
                               controls=repr(CONTROLS))
    result = subprocess.run([sys.executable, "-c", script, str(weights), str(rows)],
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "KERAS_BACKEND": "jax"})
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    for name in ("beam", "greedy"):
        expected = searches.run(name, **CONTROLS)
        ids = _best(expected)
        jax_ids = np.asarray(found[name][0])
        jax_ids = jax_ids[:, 0] if jax_ids.ndim == 3 else jax_ids
        width = max(ids.shape[1], jax_ids.shape[1])
        pad = lambda a: np.pad(a, [(0, 0), (0, width - a.shape[1])])  # noqa: E731
        np.testing.assert_array_equal(pad(jax_ids), pad(ids), err_msg=name)
        scores = np.asarray(expected["scores"] if isinstance(expected, dict) else expected[1])
        np.testing.assert_allclose(found[name][1], scores, atol=1e-4, err_msg=name)


LINES = ["the dog runs in the park", "a big red cat", "green water"]
TARGETS = ["PARK THE IN RUNS DOG THE", "CAT RED BIG A", "WATER GREEN"]


@pytest.mark.slow  # two commands, each a model load and a search
def test_translate_and_evaluate_take_the_controls_as_flags(tiny_run, tmp_path, capsys):
    from keras_transformer import cli

    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    ref.write_text("\n".join(TARGETS) + "\n", encoding="utf-8")
    common = ["--run-dir", str(tiny_run), "--beam", "4", "--alpha", "0.6", "--precision",
              "float32", "--no-xla", "--input", str(src)]
    flags = ["--no-repeat-ngram-size", "2", "--repetition-penalty", "1.3"]
    translated = tmp_path / "out.txt"
    assert cli.main(["translate", *common, *flags, "--output", str(translated)]) == 0
    said = capsys.readouterr().err
    assert "no_repeat_ngram_size 2 [flag], repetition_penalty 1.3 [flag]" in said
    expected = run_engine(tiny_run, beam_size=4, alpha=0.6, precision="float32",
                          no_repeat_ngram_size=2, repetition_penalty=1.3)
    assert translated.read_text(encoding="utf-8").splitlines() == expected.translate(LINES)
    hypotheses = tmp_path / "hyp.txt"
    assert cli.main(["evaluate", *common[:-2], "--src", str(src), "--ref", str(ref), *flags,
                     "--output", str(hypotheses)]) == 0
    assert hypotheses.read_text(encoding="utf-8") == translated.read_text(encoding="utf-8")
    assert "no_repeat_ngram_size 2 [flag]" in capsys.readouterr().err
    # Off (the default), the line says nothing of them.
    assert cli.main(["translate", *common, "--output", str(tmp_path / "plain.txt")]) == 0
    assert "repetition" not in capsys.readouterr().err
    # Refused by name before anything loads.
    for bad, said in ((["--no-repeat-ngram-size", "-1"], "--no-repeat-ngram-size -1 must be "
                       "at least 0"), (["--repetition-penalty", "0"], "--repetition-penalty "
                                       "0.0 must be above 0"),
                      (["--sample", "--no-repeat-ngram-size", "2"], "--no-repeat-ngram-size "
                       "is for beam search")):
        assert cli.main(["translate", "--run-dir", str(tiny_run), "--input", str(src), *bad,
                         "--output", str(tmp_path / "x")]) == 2
        assert said in capsys.readouterr().err
