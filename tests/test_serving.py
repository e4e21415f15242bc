"""The SavedModel's decoding signatures (prefixes, n-best, sampling, scoring) and its answers to
hostile requests, from a fresh process that imports only tensorflow and tensorflow_text."""

import json
import textwrap
import time

import numpy as np
import pytest

from keras_transformer import export
from keras_transformer.decoding.engines.translator import Translator
from keras_transformer.errors import InputError
from keras_transformer.export.graph import MAX_ROWS
from tests.conftest import run_decoder, run_engine
from tests.training_helpers import run_python

SENTENCES = ["the dog runs in the park", "a big red cat", "green water"]
PREFIXES = ["PARK THE", "", "WATER"]
TARGETS = ["PARK THE IN RUNS DOG THE", "CAT RED BIG A", "WATER GREEN"]
CONSTRAINTS = ["PARK\tDOG", "", "BIG"]  # tab-separated phrases ("" for none)

# Sends each request (signature, inputs) in turn to one loaded SavedModel and records what
# comes back, or the InvalidArgument error's message.
FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    import tensorflow_text  # noqa: F401
    directory, requests, output = sys.argv[1:4]
    loaded = tf.saved_model.load(directory)

    def plain(value):
        if isinstance(value, bytes):
            return value.decode("utf-8", errors="replace")
        return [plain(v) for v in value] if isinstance(value, list) else value

    answers = []
    text = open(requests, encoding="utf-8").read()
    for name, inputs in eval(text, {"__builtins__": {}, "nan": float("nan")}):
        function = loaded.signatures[name]
        specs = function.structured_input_signature[1]
        try:
            result = function(**{k: tf.constant(v, specs[k].dtype) for k, v in inputs.items()})
            answers.append({k: plain(v.numpy().tolist()) for k, v in result.items()})
        except tf.errors.InvalidArgumentError as error:
            answers.append({"error": error.message[:3000]})
    json.dump({"answers": answers, "modules": sorted(
        m for m in sys.modules if m.split(".")[0] in ("keras_transformer", "pipelines"))},
        open(output, "w", encoding="utf-8"))
""")


def serve(sentences, beam_size=4, alpha=0.6, prefixes=(), constraints=(),
          no_repeat_ngram_size=0, repetition_penalty=1.0):
    return ("serving_default", dict(sentences=sentences, beam_size=beam_size, alpha=alpha,
                                    prefixes=list(prefixes), constraints=list(constraints),
                                    no_repeat_ngram_size=no_repeat_ngram_size,
                                    repetition_penalty=repetition_penalty))


def nbest(sentences, beam_size=4, num_hypotheses=4, prefixes=(), constraints=(),
          no_repeat_ngram_size=0, repetition_penalty=1.0):
    return ("translate_nbest", dict(sentences=sentences, beam_size=beam_size, alpha=0.6,
                                    num_hypotheses=num_hypotheses, prefixes=list(prefixes),
                                    constraints=list(constraints),
                                    no_repeat_ngram_size=no_repeat_ngram_size,
                                    repetition_penalty=repetition_penalty))


def sample(sentences, num_samples=3, top_k=10, top_p=0.9, temperature=0.8, seed=5,
           prefixes=()):
    return ("sample", dict(sentences=sentences, num_samples=num_samples, top_k=top_k,
                           top_p=top_p, temperature=temperature, seed=seed,
                           prefixes=list(prefixes)))


def score(sources, targets):
    return ("score", dict(sources=sources, targets=targets))


NAN = float("nan")
# (request, the start of the error it gets, or None: answered).
HOSTILE = [
    (serve([]), None),
    (serve(["", "   "]), None),
    (serve([b"\xff\xfe dog \xc3", "caf\xe9".encode("latin-1")]), None),
    (serve(["the dog runs " * 7700]), None),  # 100,100 characters
    (serve(SENTENCES, beam_size=0), "beam_size must be at least 1"),
    (serve(SENTENCES, beam_size=-3), "beam_size must be at least 1"),
    (serve(SENTENCES, beam_size=500), "beam_size must be <= 64"),
    (serve(SENTENCES, alpha=NAN), "alpha must be at least 0"),
    (serve(["a dog"] * (MAX_ROWS + 1), beam_size=1), f"a request may search at most {MAX_ROWS}"),
    (serve(["a dog"] * 300, beam_size=4), f"a request may search at most {MAX_ROWS}"),
    (serve(SENTENCES, prefixes=["A"]), "prefixes must give one entry per sentence"),
    (nbest(SENTENCES, num_hypotheses=0), "num_hypotheses must be >= 1"),
    (nbest(SENTENCES, num_hypotheses=5), "num_hypotheses must be <= beam_size"),
    (nbest([]), None),
    (sample(SENTENCES, num_samples=0), "num_samples must be at least 1"),
    (sample(SENTENCES, num_samples=2 ** 31 - 1), "num_samples must be <= 64"),
    (sample(["a dog"] * 20, num_samples=64), f"a request may search at most {MAX_ROWS}"),
    (sample(SENTENCES, top_k=-1), "top_k must be at least 0"),
    (sample(SENTENCES, top_p=0.0), "top_p must be in (0, 1]"),
    (sample(SENTENCES, top_p=1.5), "top_p must be in (0, 1]"),
    (sample(SENTENCES, top_p=NAN), "top_p must be in (0, 1]"),
    (sample(SENTENCES, temperature=0.0), "temperature must be above 0"),
    (sample(SENTENCES, temperature=NAN), "temperature must be above 0"),
    (sample(SENTENCES, seed=-1), "seed must be in [0, 2**31)"),
    (sample(["", "a dog"]), None),
    (score(SENTENCES, TARGETS[:2]), "targets must give one target per source"),
    (score(["a"] * 600, ["DOG " * 30] * 600), "a request may score at most 16384 target"),
    (score(["a dog"], ["DOG " * 200]), "targets must be at most 82 subword tokens"),
    (score([], []), None),
    # The repetition controls.
    (serve(SENTENCES, no_repeat_ngram_size=-1), "no_repeat_ngram_size must be at least 0"),
    (serve(SENTENCES, repetition_penalty=0.0), "repetition_penalty must be above 0"),
    (nbest(SENTENCES, repetition_penalty=-2.0), "repetition_penalty must be above 0"),
    (serve(SENTENCES, repetition_penalty=NAN), "repetition_penalty must be above 0"),
    # Terminology constraints (tab-separated phrases per sentence).
    (serve(SENTENCES, constraints=["DOG", "CAT"]), "constraints must give one entry per "
     "sentence"),
    (serve(SENTENCES[:1], constraints=["\t".join(["DOG"] * 100)]), "constraints: a sentence "
     "may have at most 32 phrases"),
    (serve(SENTENCES[:1], constraints=["DOG " * 300]), "constraints: a phrase may have at most"),
    (serve(SENTENCES[:1], beam_size=1, constraints=["DOG"]), "constraints need beam search"),
    (serve(SENTENCES[:2], constraints=["", "\t \t"]), None),  # empty phrases: none
    (serve(SENTENCES[:1], constraints=[b"\xff\xfe DOG \xc3"]), None),
    (nbest(SENTENCES[:1], beam_size=2, num_hypotheses=2, constraints=["DOG"]), None),
]
FEATURES = [
    serve(SENTENCES),
    serve(SENTENCES, prefixes=PREFIXES),
    nbest(SENTENCES, prefixes=PREFIXES),
    nbest(SENTENCES, beam_size=2, num_hypotheses=2),
    sample(SENTENCES[:1]),
    sample(SENTENCES[:1]),
    sample(SENTENCES[:1], top_k=1, top_p=1.0, temperature=1.0, num_samples=2),
    score(SENTENCES + [""], TARGETS + [""]),
    serve(SENTENCES, constraints=CONSTRAINTS),
    nbest(SENTENCES, constraints=CONSTRAINTS),
    serve(SENTENCES, no_repeat_ngram_size=2, repetition_penalty=1.3),
    nbest(SENTENCES, prefixes=PREFIXES, no_repeat_ngram_size=2, repetition_penalty=1.3),
    serve(SENTENCES, constraints=CONSTRAINTS, no_repeat_ngram_size=2),
]


@pytest.fixture(scope="module")
def served(toy_saved_model, tmp_path_factory):
    """The answers of one SavedModel export of tiny_run (shared with test_serving_tf1.py),
    loaded in a fresh process, to the hostile requests in turn, then to the feature
    requests."""
    folder = tmp_path_factory.mktemp("serving")
    path = toy_saved_model
    start = time.time()
    requests = folder / "requests.py"
    requests.write_text(repr([r for r, _ in HOSTILE] + FEATURES), encoding="utf-8")
    result = run_python("-c", FRESH_PROCESS, str(path), str(requests), str(folder / "a.json"),
                        timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    print(f"requests: {time.time() - start:.1f} s")
    # The optional inputs' defaults are in the SignatureDefs (TensorFlow Serving applies them).
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())
    signatures = proto.meta_graphs[0].signature_def
    defaults = {name: sorted(signatures[name].defaults) for name in
                ("serving_default", "translate_nbest", "sample", "score")}
    assert defaults == {
        "serving_default": ["alpha", "beam_size", "constraints", "no_repeat_ngram_size",
                            "prefixes", "repetition_penalty"],
        "translate_nbest": ["alpha", "beam_size", "constraints", "no_repeat_ngram_size",
                            "num_hypotheses", "prefixes", "repetition_penalty"],
        "sample": ["num_samples", "prefixes", "seed", "temperature", "top_k", "top_p"],
        "score": []}, defaults
    answers = json.loads((folder / "a.json").read_text(encoding="utf-8"))
    assert answers["modules"] == []  # none of our code was imported there
    return answers["answers"][:len(HOSTILE)], answers["answers"][len(HOSTILE):]


@pytest.fixture(scope="module")
def translator(toy_translators):
    return toy_translators[4]


@pytest.mark.slow
def test_hostile_requests_get_their_documented_answers_and_the_next_is_served(
        served, translator):
    hostile, features = served
    for (request, error), answer in zip(HOSTILE, hostile):
        if error is None:
            assert "error" not in answer, (request[0], answer)
        else:
            assert error in answer.get("error", ""), (request[0], error, answer)
            name = error.split()[0]
            assert name in answer["error"]  # the input is named
    assert hostile[0] == {"translations": [], "scores": []}
    assert hostile[1] == {"translations": ["", ""], "scores": [0.0, 0.0]}
    assert all(isinstance(t, str) for t in hostile[2]["translations"])
    # Truncated to the run's max_length, then translated as the translator does.
    assert hostile[3]["translations"] == translator.translate([HOSTILE[3][0][1]["sentences"][0]])
    assert hostile[3]["scores"][0] < 0
    assert np.shape(hostile[13]["translations"]) == (0,)
    assert hostile[24]["translations"][0] == ["", "", ""] and hostile[24]["scores"][0] == [0] * 3
    assert hostile[28] == {"log_prob": [], "tokens": [], "mean": []}
    # After all of them, a normal request is answered as the in-process translator answers it.
    assert features[0]["translations"] == translator.translate(SENTENCES)
    # The in-process translator refuses a NaN alpha as the graph does.
    with pytest.raises(InputError, match="alpha=nan must be at least 0"):
        Translator(translator.source_model, translator.vocabulary, alpha=NAN)


@pytest.mark.slow
def test_prefixes_and_nbest_equal_the_translators(served, translator, toy_translators):
    _, features = served
    with_prefix = translator.translate(SENTENCES, nbest=True, prefixes=PREFIXES)
    assert features[1]["translations"] == [h[0][0] for h in with_prefix]
    assert features[2]["translations"] == [[text for text, _ in h] for h in with_prefix]
    np.testing.assert_allclose(features[2]["scores"], [[s for _, s in h] for h in with_prefix],
                               atol=1e-4)
    for text, prefix in zip(features[1]["translations"], PREFIXES):
        assert text.startswith(prefix)
    beam2 = toy_translators[2].translate(SENTENCES, nbest=True)
    assert features[3]["translations"] == [[text for text, _ in h] for h in beam2]


@pytest.mark.slow
def test_sampling_is_seeded_and_equals_the_translators(served, translator, toy_translators):
    _, features = served
    first, again, greedy = features[4:7]
    assert first == again
    expected = translator.sample(SENTENCES[:1], num_samples=3, top_k=10, top_p=0.9,
                                 temperature=0.8, seed=5)
    assert first["translations"] == [[text for text, _ in expected[0]]]
    np.testing.assert_allclose(first["scores"], [[s for _, s in expected[0]]], atol=1e-4)
    # top_k=1 leaves only the most likely token: greedy search.
    assert greedy["translations"][0] == toy_translators[1].translate(SENTENCES[:1]) * 2


@pytest.mark.slow
def test_score_signature_equals_the_translators(served, translator):
    _, features = served
    expected = translator.score(SENTENCES + [""], TARGETS + [""])
    found = features[7]
    assert found["tokens"] == [e["tokens"] for e in expected]
    np.testing.assert_allclose(found["log_prob"], [e["log_prob"] for e in expected], atol=1e-4)
    np.testing.assert_allclose(found["mean"], [e["mean"] for e in expected], atol=1e-5)


@pytest.mark.slow
def test_the_tflite_model_returns_the_beams_nbest(tiny_run, toy_translators, tmp_path):
    from ai_edge_litert.interpreter import Interpreter

    path = export.export_run(run_decoder(tiny_run, beam_size=2), format="tflite",
                             output_dir=tmp_path, name="toy")
    runner = Interpreter(model_path=str(path)).get_signature_runner()
    translator = toy_translators[2]
    expected = translator.translate(SENTENCES + [""], nbest=True)
    for rows, sentence, hypotheses in zip(translator.encode(SENTENCES + [""]),
                                          SENTENCES + [""], expected):
        out = runner(source_ids=np.array([rows], np.int32))
        assert out["nbest_ids"].shape[:2] == (1, 2) and out["nbest_scores"].shape == (1, 2)
        texts = translator.vocabulary.decode(out["nbest_ids"][0])
        found = [(t, s) for t, s in zip(texts, out["nbest_scores"][0].tolist()) if s > -1e8]
        assert [t for t, _ in found] == [t for t, _ in hypotheses], sentence
        np.testing.assert_allclose([s for _, s in found], [s for _, s in hypotheses], atol=1e-4)
        assert out["ids"][0].tolist() == out["nbest_ids"][0, 0, :len(out["ids"][0])].tolist()


@pytest.mark.slow
def test_constraints_are_served_as_the_translator_meets_them(served, translator):
    hostile, features = served
    phrases = [constraint.split("\t") if constraint else [] for constraint in CONSTRAINTS]
    expected = translator.translate(SENTENCES, constraints=phrases)
    assert features[8]["translations"] == expected
    for text, wanted in zip(features[8]["translations"], phrases):
        assert all(phrase in text for phrase in wanted), (text, wanted)
    # Every hypothesis found holds them (a place the pool did not fill: empty, NEG_INF).
    for hypotheses, scores, wanted in zip(features[9]["translations"], features[9]["scores"],
                                          phrases):
        assert scores[0] > -1e8
        assert all(phrase in text for text, score in zip(hypotheses, scores) if score > -1e8
                   for phrase in wanted)
    # A request without constraints after the constrained ones is answered as before.
    assert features[0]["translations"] == translator.translate(SENTENCES)
    assert hostile[-3]["translations"] == translator.translate(SENTENCES[:2])
    found = [(text, score) for text, score in zip(hostile[-1]["translations"][0],
                                                  hostile[-1]["scores"][0]) if score > -1e8]
    assert found and all("DOG" in text for text, _ in found)


@pytest.mark.slow
def test_the_export_holds_each_search_loop_once(toy_saved_model):
    """Every signature that beam-searches without constraints calls one traced search
    (`graph.unconstrained_search`): the saved graph holds five search loops, not one set per
    caller (nine before, and an export twice as slow to trace and load), and the n-gram
    rule's loop in each beam search."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel.FromString(
        (toy_saved_model / "saved_model.pb").read_bytes())
    loops = [node.op for function in proto.meta_graphs[0].graph_def.library.function
             for node in function.node_def if node.op in ("While", "StatelessWhile")]
    # The unconstrained beam search with and without prefix masking, the constrained one
    # (two: the plain search it runs first, search.plain_first), sampling and
    # translate_ids_xla's; and inside each of the four beam searches that take the request's
    # no_repeat_ngram_size, the n-gram rule's loop of n - 1 comparisons.
    assert len(loops) == 6 + 4, loops


@pytest.mark.slow
def test_the_repetition_controls_are_served_as_the_translator_applies_them(tiny_run, served,
                                                                           translator):
    _, features = served
    controls = dict(no_repeat_ngram_size=2, repetition_penalty=1.3)
    controlled = run_engine(tiny_run, beam_size=4, alpha=0.6, precision="float32",
                            **controls)
    expected = controlled.translate(SENTENCES, nbest=True)
    assert features[10]["translations"] == [h[0][0] for h in expected]
    np.testing.assert_allclose(features[10]["scores"], [h[0][1] for h in expected], atol=1e-4)
    with_prefix = controlled.translate(SENTENCES, nbest=True, prefixes=PREFIXES)
    assert features[11]["translations"] == [[text for text, _ in h] for h in with_prefix]
    np.testing.assert_allclose(features[11]["scores"], [[s for _, s in h] for h in with_prefix],
                               atol=1e-4)
    phrases = [constraint.split("\t") if constraint else [] for constraint in CONSTRAINTS]
    bigrams = run_engine(tiny_run, beam_size=4, alpha=0.6, precision="float32",
                         no_repeat_ngram_size=2)
    assert features[12]["translations"] == bigrams.translate(SENTENCES, constraints=phrases)
    for text, wanted in zip(features[12]["translations"], phrases):
        assert all(phrase in text for phrase in wanted), (text, wanted)
