"""The SavedModel as TensorFlow Serving runs it: loaded into a TF1 Session, a request giving
only some inputs and the rest taken from the SignatureDef's `defaults` (TF Serving's Predict
handler, emulated by `benchmarks/tf_serving.py`'s `PredictHandler`), in a fresh graph-mode
process that imports only TensorFlow and tensorflow-text; and that benchmark's smoke run."""

import json
import os
import pathlib
import sys
import textwrap

import numpy as np
import pytest

from keras_transformer import export
from tests.conftest import run_decoder, run_engine
from tests.training_helpers import run_python

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
SENTENCES = ["the dog runs in the park", "a big red cat", "green water", ""]
PREFIXES = ["PARK THE", "", "WATER", ""]

# Sends each (signature, inputs) request in turn to one PredictHandler, TF1 graph mode only
# (as TF Serving's C++ runs a SavedModel), and records the answers or the refusals; then the
# threaded requests through the same Session (one process and one load for both).
FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    benchmarks, directory, requests, output, threaded, rounds = sys.argv[1:7]
    sys.path.insert(0, benchmarks)
    from tf_serving import PredictError, PredictHandler

    def plain(value):
        if isinstance(value, bytes):
            return value.decode("utf-8")
        return [plain(v) for v in value] if isinstance(value, list) else value

    # Every request of THREADED sent alone, in turn, then all of them at once from one thread
    # each (released together by a barrier), `rounds` times: through the one TF1 Session, as
    # TF Serving's threads call it. The lone answers and every concurrent answer.
    def threaded_answers(handler, requests, rounds):
        import threading

        def answer(name, inputs):
            return {k: v.tolist() if v.dtype != object else [
                x.decode() if isinstance(x, bytes) else [y.decode() for y in x]
                for x in v.tolist()] for k, v in handler.predict(inputs, name).items()}

        requests = json.load(open(requests, encoding="utf-8"))
        alone = [answer(*request) for request in requests]
        together = []
        for _ in range(rounds):
            barrier, results = threading.Barrier(len(requests)), [None] * len(requests)

            def send(index):
                barrier.wait()
                results[index] = answer(*requests[index])

            threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            together.append(results)
        return {"alone": alone, "together": together}

    handler = PredictHandler(directory)
    warmed = handler.warm_up()  # the export's warm-up records, as TF Serving runs them at load
    answers = []
    for name, inputs in json.load(open(requests, encoding="utf-8")):
        try:
            answers.append({k: plain(v.tolist()) for k, v in handler.predict(inputs, name).items()})
        except PredictError as error:
            answers.append({"refused": str(error)})
    signatures = {name: {"inputs": {a: i.name for a, i in s.inputs.items()},
                         "defaults": {a: plain(tf.make_ndarray(t).tolist())
                                      for a, t in s.defaults.items()}}
                  for name, s in handler.signatures.items()}
    ours = sorted(m for m in sys.modules if m.split(".")[0] in ("keras_transformer", "pipelines"))
    json.dump({"answers": answers, "signatures": signatures, "eager": tf.executing_eagerly(),
               "modules": ours, "warmed": warmed,
               "threaded": threaded_answers(handler, threaded, int(rounds))},
              open(output, "w", encoding="utf-8"))
""")

CONSTRAINTS = ["PARK\tDOG", "", "BIG", ""]  # tab-separated phrases per sentence
REQUESTS = [
    ("serving_default", {"sentences": SENTENCES}),
    ("serving_default", {"sentences": SENTENCES, "prefixes": PREFIXES}),
    ("translate_nbest", {"sentences": SENTENCES}),
    ("translate_nbest", {"sentences": SENTENCES, "prefixes": PREFIXES}),
    ("serving_default", {"sentences": SENTENCES, "beam_size": 2}),  # a request's value wins
    ("score", {"sources": SENTENCES}),  # no defaults there: TF Serving refuses
    ("serving_default", {"sentences": SENTENCES, "beam": 2}),  # not an input: refused
    ("serving_default", {"sentences": SENTENCES, "constraints": CONSTRAINTS}),
    # One repetition control given, the other and the search's from the defaults.
    ("serving_default", {"sentences": SENTENCES, "no_repeat_ngram_size": 2}),
]


@pytest.fixture(scope="module")
def exports(toy_saved_model, tmp_path_factory):
    """tiny_run's SavedModel (beam 4, alpha 0.6: the defaults; shared with test_serving.py)
    and a folder of this module's own."""
    return {"saved_model": toy_saved_model, "folder": tmp_path_factory.mktemp("serving-tf1")}


@pytest.fixture(scope="module")
def served(exports):
    folder = exports["folder"]
    (folder / "requests.json").write_text(json.dumps(REQUESTS), encoding="utf-8")
    (folder / "threaded.json").write_text(json.dumps(THREADED), encoding="utf-8")
    result = run_python("-c", FRESH_PROCESS, str(BENCHMARKS), str(exports["saved_model"]),
                        str(folder / "requests.json"), str(folder / "answers.json"),
                        str(folder / "threaded.json"), "3")
    assert result.returncode == 0, result.stderr[-3000:]
    served = json.loads((folder / "answers.json").read_text(encoding="utf-8"))
    assert served["modules"] == [] and served["eager"] is False  # TF1 graph mode, TF only
    return served


def _best(hypotheses):
    return [h[0][0] for h in hypotheses], [h[0][1] for h in hypotheses]


@pytest.mark.slow
def test_a_request_of_sentences_only_gets_the_signature_defaults(served, toy_translators):
    signatures = served["signatures"]
    # The defaults TF Serving applies are the export's search settings (beam 4, alpha 0.6).
    assert signatures["serving_default"]["defaults"] == {
        "beam_size": 4, "alpha": pytest.approx(0.6), "prefixes": [], "constraints": [],
        "no_repeat_ngram_size": 0, "repetition_penalty": 1.0}
    assert signatures["translate_nbest"]["defaults"] == {
        "beam_size": 4, "alpha": pytest.approx(0.6), "num_hypotheses": 4, "prefixes": [],
        "constraints": [], "no_repeat_ngram_size": 0, "repetition_penalty": 1.0}
    assert signatures["score"]["defaults"] == {}
    assert signatures["serving_default"]["inputs"]["sentences"].endswith(":0")

    answer = served["answers"][0]
    texts, scores = _best(toy_translators[4].translate(SENTENCES, nbest=True))
    assert answer["translations"] == texts
    np.testing.assert_allclose(answer["scores"], scores, atol=1e-4)
    assert answer["translations"][-1] == "" and answer["scores"][-1] == 0.0
    # beam_size given in the request replaces the default.
    texts, scores = _best(toy_translators[2].translate(SENTENCES, nbest=True))
    assert served["answers"][4]["translations"] == texts
    np.testing.assert_allclose(served["answers"][4]["scores"], scores, atol=1e-4)


@pytest.mark.slow
def test_the_session_runs_the_exports_warm_up_requests_first(served, exports):
    """The default export's assets.extra/tf_serving_warmup_requests: one request per
    signature a CPU server runs (not translate_ids_xla), every input given (the signature's
    default, or a sentence and its ids), replayed through the Session before the requests
    above, which then get the answers the other tests check."""
    import tensorflow as tf

    from keras_transformer.export.warmup import SENTENCE

    sys.path.insert(0, str(BENCHMARKS))
    from tf_serving import signature_defs, warmup_requests

    names = ["sample", "score", "serving_default", "translate_ids", "translate_nbest"]
    assert served["warmed"] == names
    signatures = signature_defs(exports["saved_model"])
    for name, inputs in warmup_requests(exports["saved_model"]):
        assert sorted(inputs) == sorted(signatures[name].inputs), name
        for alias, value in inputs.items():
            if alias in signatures[name].defaults:
                default = tf.make_ndarray(signatures[name].defaults[alias])
                assert value.tolist() == default.tolist(), (name, alias)
            elif value.dtype == object:
                assert value.tolist() == [SENTENCE.encode("utf-8")]
            else:  # translate_ids: the sentence's subword ids, EOS last
                assert value.shape[0] == 1 and value.shape[1] > 2 and value[0, -1] == 2


@pytest.mark.slow
def test_prefixes_and_nbest_through_the_defaults_equal_the_translators(served, toy_translators):
    answers = served["answers"]
    with_prefix = toy_translators[4].translate(SENTENCES, nbest=True, prefixes=PREFIXES)
    texts, scores = _best(with_prefix)
    assert answers[1]["translations"] == texts
    np.testing.assert_allclose(answers[1]["scores"], scores, atol=1e-4)
    for text, prefix in zip(answers[1]["translations"], PREFIXES):
        assert text.startswith(prefix)
    # num_hypotheses defaults to the beam: the whole beam, best first.
    for answer, expected in ((answers[2], toy_translators[4].translate(SENTENCES, nbest=True)),
                             (answers[3], with_prefix)):
        assert np.shape(answer["translations"]) == (len(SENTENCES), 4)
        assert answer["translations"][:3] == [[t for t, _ in h] for h in expected[:3]]
        np.testing.assert_allclose(answer["scores"][:3], [[s for _, s in h] for h in expected[:3]],
                                   atol=1e-4)
        assert any(t for row in answer["translations"] for t in row)  # not all empty


@pytest.mark.slow
def test_constraints_through_the_session_equal_the_translators(served, toy_translators):
    phrases = [c.split("\t") if c else [] for c in CONSTRAINTS]
    answer = served["answers"][7]
    assert answer["translations"] == toy_translators[4].translate(SENTENCES, constraints=phrases)
    for text, wanted in zip(answer["translations"], phrases):
        assert all(phrase in text for phrase in wanted), (text, wanted)


@pytest.mark.slow
def test_requests_tf_serving_refuses_are_refused_by_name(served):
    missing, unknown = served["answers"][5:7]
    assert "missing ['targets']" in missing["refused"], missing
    assert "unknown ['beam']" in unknown["refused"], unknown


# Requests with the export's options (batched together) and others (searched alone) at once.
THREADED = [
    ("serving_default", {"sentences": SENTENCES}),
    ("serving_default", {"sentences": SENTENCES[:2]}),
    ("serving_default", {"sentences": SENTENCES, "prefixes": PREFIXES}),
    ("serving_default", {"sentences": SENTENCES[1:], "beam_size": 2}),
    ("serving_default", {"sentences": SENTENCES[:1], "beam_size": 1, "prefixes": ["PARK"]}),
    ("serving_default", {"sentences": SENTENCES, "alpha": 1.0}),
    ("translate_nbest", {"sentences": SENTENCES}),
    ("translate_nbest", {"sentences": SENTENCES[2:], "num_hypotheses": 2,
                         "prefixes": PREFIXES[2:]}),
    ("translate_nbest", {"sentences": SENTENCES[:3], "beam_size": 3, "num_hypotheses": 3}),
    ("serving_default", {"sentences": [""]}),
]


@pytest.mark.slow
def test_concurrent_requests_through_one_session_get_their_lone_answers(served,
                                                                         toy_translators):
    """The default export batches the searches of concurrent requests with its options
    (export/batching.py): each request still gets exactly its own answer, whatever shares
    its batch, and requests with other beam sizes, alphas or prefixes at the same time get
    theirs."""
    answers = served["threaded"]  # THREADED, through the Session of `served`
    alone = answers["alone"]
    for results in answers["together"]:
        for request, lone, together in zip(THREADED, alone, results):
            assert together["translations"] == lone["translations"], request
            np.testing.assert_allclose(together["scores"], lone["scores"], atol=1e-5,
                                       err_msg=str(request))
    # The lone answers are the in-process translators' (batched or not, the same search).
    texts, scores = _best(toy_translators[4].translate(SENTENCES, nbest=True,
                                                       prefixes=PREFIXES))
    assert alone[2]["translations"] == texts
    np.testing.assert_allclose(alone[2]["scores"], scores, atol=1e-4)
    texts, _ = _best(toy_translators[2].translate(SENTENCES[1:], nbest=True))
    assert alone[3]["translations"] == texts
    expected = toy_translators[4].translate(SENTENCES, nbest=True)
    assert [row[:len(h)] for row, h in zip(alone[6]["translations"], expected)] == [
        [t for t, _ in h] for h in expected]
    assert any(t for row in alone[6]["translations"] for t in row)  # not all empty
    assert alone[9] == {"translations": [""], "scores": [0.0]}


@pytest.mark.slow
def test_the_export_batches_in_the_graph_and_says_so_for_a_server(exports):
    """The default export's text signatures hold the BatchFunction op (translate_ids does
    not), and assets.extra/ holds the same settings for TF Serving's own batching."""
    from keras_transformer.defaults import BATCH_MAX_ROWS, BATCH_THREADS, BATCH_TIMEOUT_MS

    path = exports["saved_model"]
    for signature in ("serving_default", "translate_nbest"):
        assert "BatchFunction" in export.signature_op_types(path, signature)
    assert "BatchFunction" not in export.signature_op_types(path, "translate_ids")
    text = (path / "assets.extra" / "batching_parameters.txt").read_text(encoding="utf-8")
    assert f"max_batch_size {{ value: {BATCH_MAX_ROWS} }}" in text
    assert f"batch_timeout_micros {{ value: {int(BATCH_TIMEOUT_MS * 1000)} }}" in text
    assert f"num_batch_threads {{ value: {BATCH_THREADS} }}" in text
    assert "max_enqueued_batches" in text


@pytest.mark.slow
def test_the_load_benchmark_smoke_run_answers_every_request_alike(exports, tiny_run, toy_corpus,
                                                                   capsys, monkeypatch):
    ct2 = export.export_run(run_decoder(tiny_run), format="ctranslate2",
                            output_dir=exports["folder"], name="toy")
    # The benchmark's parent runs here; each engine still runs in a fresh process of its own.
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import serving_load

    capsys.readouterr()
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    # The server settings docs/export.md recommends (intra-op 1, TensorFlow's own kernels).
    status = serving_load.main(["--tiny", "--saved-model", str(exports["saved_model"]),
                                "--ctranslate2-model", str(ct2),
                                "--sentences", str(toy_corpus["dev.src"]),
                                "--intra-op-threads", "1", "--no-onednn"])
    assert os.environ.get("TF_ENABLE_ONEDNN_OPTS") == onednn  # only the engines' processes
    out, err = capsys.readouterr()
    assert status == 0, out[-2000:] + err[-3000:]
    record = json.loads(out.strip().splitlines()[-1])
    from ct2_reference import label, threading_grid

    # CTranslate2 ran once per threading setting of this machine's cores (its sweep).
    settings = [label(setting) for setting in threading_grid()]
    assert sorted(record["engines"]) == sorted(
        ["session"] + [f"ctranslate2 {name}" for name in settings]), record
    assert record["ok"], record
    assert (record["engines"]["session"]["intra_op_threads"],
            record["engines"]["session"]["onednn"]) == (1, False), record
    # Every ratio is against the best setting at that client thread count (the defaults,
    # one worker with intra_threads 0, are measured and never the anchor).
    session = record["engines"]["session"]["threads"]
    for count in ("1", "2", "4", "8"):
        rates = {name: record["engines"][f"ctranslate2 {name}"]["threads"][count][
            "requests_per_s"] for name in settings if "defaults" not in name}
        best = max(rates, key=rates.get)
        assert record["ctranslate2_best"][count] == best
        assert record["session_ratio_vs_ctranslate2"][count] == round(
            session[count]["requests_per_s"] / rates[best], 3)
    for engine in record["engines"].values():
        assert engine["requests"] == 40 and engine["first_error"] is None, engine
        assert sorted(engine["peak_rss_mb_after"], key=int) == ["8", "40"], engine
        assert sorted(engine["threads"], key=int) == ["1", "2", "4", "8"]
        for figures in engine["threads"].values():
            assert figures["errors"] == figures["mismatches"] == 0, engine
            assert figures["requests_per_s"] > 0 and 0 < figures["p50_ms"] <= figures["p99_ms"]


def test_a_request_is_filled_from_the_signature_defaults_as_tf_serving_fills_it():
    """`request_feeds` on a SignatureDef built here: given inputs win, absent ones take the
    defaults, an unknown or a missing input without default is refused by name."""
    import tensorflow as tf
    from tensorflow.core.protobuf import meta_graph_pb2

    sys.path.insert(0, str(BENCHMARKS))
    from serving_load import differs
    from tf_serving import PredictError, request_feeds

    signature = meta_graph_pb2.SignatureDef(method_name="tensorflow/serving/predict")
    for alias, dtype in (("sentences", tf.string), ("beam_size", tf.int32),
                         ("alpha", tf.float32)):
        signature.inputs[alias].name = f"serve_{alias}:0"
        signature.inputs[alias].dtype = dtype.as_datatype_enum
    signature.defaults["beam_size"].CopyFrom(tf.make_tensor_proto(4, tf.int32))
    signature.defaults["alpha"].CopyFrom(tf.make_tensor_proto(0.6, tf.float32))

    feeds = {alias: (info.name, value) for alias, info, value in
             request_feeds(signature, {"sentences": ["a dog"], "alpha": 1.0})}
    assert feeds["sentences"][0] == "serve_sentences:0"
    assert feeds["sentences"][1].tolist() == ["a dog"]
    assert feeds["beam_size"][1] == 4 and feeds["beam_size"][1].dtype == np.int32
    assert feeds["alpha"][1] == 1.0 and feeds["alpha"][1].dtype == np.float32
    with pytest.raises(PredictError, match=r"missing \['sentences'\]"):
        request_feeds(signature, {"alpha": 1.0})
    with pytest.raises(PredictError, match=r"unknown \['beam'\]"):
        request_feeds(signature, {"sentences": ["a"], "beam": 2})
    # The benchmark's answer check: texts equal, scores within 1e-5.
    assert not differs((["a"], [-1.0]), (["a"], [-1.000001]))
    assert differs((["a"], [-1.0]), (["a"], [-1.1])) and differs((["b"], None), (["a"], None))


@pytest.mark.slow
def test_a_repetition_control_through_the_defaults_equals_the_translators(served, tiny_run):
    translator = run_engine(tiny_run, beam_size=4, alpha=0.6, precision="float32",
                            no_repeat_ngram_size=2)
    texts, scores = _best(translator.translate(SENTENCES, nbest=True))
    answer = served["answers"][8]
    assert answer["translations"] == texts
    np.testing.assert_allclose(answer["scores"], scores, atol=1e-4)
