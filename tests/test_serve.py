"""`serve`: TensorFlow Serving's REST API over a run's engines (keras_transformer/serving/),
in process through Starlette's TestClient: answers equal to the engines', the options as
request inputs with the request's own refusals, TensorFlow Serving's error shape and status
codes, the status and metadata, API keys, metrics."""

import json
import pathlib
import sys
import time

import pytest

from tests.conftest import run_engine

pytestmark = pytest.mark.slow  # trains the tiny run, exports it, loads the engines

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
SENTENCES = ["the dog runs in the park", "a big red cat", "green water", ""]


@pytest.fixture(scope="module")
def ct2_export(tiny_run, tmp_path_factory):
    from keras_transformer import export
    from tests.conftest import run_decoder

    return export.export_run(run_decoder(tiny_run), "ctranslate2", "int8",
                             output_dir=tmp_path_factory.mktemp("serve-ct2"), name="toy")


def served_client(run_dir, **settings):
    """A TestClient of the app `serve` runs (its lifespan loads the engines), once
    AVAILABLE."""
    from starlette.testclient import TestClient

    from keras_transformer.serving.app import build_app
    from keras_transformer.serving.server import ServeSettings, served_model

    served, _ = served_model(ServeSettings(run_dir=str(run_dir), model_name="toy",
                                           access_log=False, **settings))
    client = TestClient(build_app(served))
    client.__enter__()
    deadline = time.monotonic() + 300
    while served.state != "AVAILABLE":
        assert served.state != "END", served.error_message
        assert time.monotonic() < deadline, served.state
        time.sleep(0.05)
    client.served = served
    return client


@pytest.fixture(scope="module")
def ct2_client(tiny_run, ct2_export):
    client = served_client(tiny_run, engine="ctranslate2", ctranslate2_model=str(ct2_export))
    yield client
    client.__exit__(None, None, None)


@pytest.fixture(scope="module")
def ct2_engine(tiny_run, ct2_export):
    return run_engine(tiny_run, engine="ctranslate2", ctranslate2_model=str(ct2_export))


def predict(client, body, path="/v1/models/toy:predict"):
    reply = client.post(path, content=body if isinstance(body, bytes) else json.dumps(body))
    return reply.status_code, reply.json()


def test_row_and_columnar_answers_equal_the_ctranslate2_engines(ct2_client, ct2_engine):
    found = ct2_engine.translate(SENTENCES, nbest=True)
    status, rows = predict(ct2_client, {"instances": [{"sentences": s} for s in SENTENCES]})
    assert status == 200, rows
    assert [r["translations"] for r in rows["predictions"]] == [h[0][0] for h in found]
    assert [r["scores"] for r in rows["predictions"]] == pytest.approx([h[0][1] for h in found])
    assert any(r["translations"] for r in rows["predictions"])  # not all empty
    status, columns = predict(ct2_client, {"signature_name": "serving_default",
                                           "inputs": {"sentences": SENTENCES}})
    assert status == 200
    assert columns["outputs"]["translations"] == [h[0][0] for h in found]
    assert predict(ct2_client, {"inputs": {"sentences": SENTENCES}},
                   "/v1/models/toy/versions/1:predict")[1] == columns


def test_options_are_request_inputs(tiny_run, ct2_client, ct2_export):
    beam2 = run_engine(tiny_run, engine="ctranslate2", ctranslate2_model=str(ct2_export),
                       beam_size=2, alpha=1.0, repetition_penalty=1.5)
    status, answer = predict(ct2_client, {"inputs": {
        "sentences": SENTENCES, "beam_size": 2, "alpha": 1, "repetition_penalty": 1.5}})
    assert status == 200 and answer["outputs"]["translations"] == beam2.translate(SENTENCES)
    status, nbest = predict(ct2_client, {"signature_name": "translate_nbest", "inputs": {
        "sentences": SENTENCES, "num_hypotheses": 3}})
    assert status == 200 and [len(row) for row in nbest["outputs"]["translations"]] == [3] * 4
    prefixes = ["PARK THE", "", "WATER", ""]
    status, prefixed = predict(ct2_client, {"inputs": {"sentences": SENTENCES,
                                                       "prefixes": prefixes}})
    assert status == 200
    for text, prefix in zip(prefixed["outputs"]["translations"], prefixes):
        assert text.startswith(prefix)
    sample = {"signature_name": "sample", "inputs": {"sentences": SENTENCES[:2], "seed": 7,
                                                    "num_samples": 2, "top_k": 5}}
    first, again = predict(ct2_client, sample), predict(ct2_client, sample)
    assert first[0] == 200 and first == again  # a seed gives the same samples
    status, scored = predict(ct2_client, {"signature_name": "score", "instances": [
        {"sources": "a big red cat", "targets": "TAC DER GIB A"}]})
    assert status == 200 and scored["predictions"][0]["tokens"] > 1
    assert scored["predictions"][0]["log_prob"] < 0


def test_constraints_go_to_the_keras_engine_or_are_refused_by_name(ct2_client, tiny_run,
                                                                  ct2_export):
    status, answer = predict(ct2_client, {"inputs": {"sentences": ["a big red cat"],
                                                     "constraints": ["GREEN"]}})
    assert status == 200 and "GREEN" in answer["outputs"]["translations"][0]
    client = served_client(tiny_run, engine="ctranslate2", ctranslate2_model=str(ct2_export),
                           keras_fallback=False)
    try:
        status, refused = predict(client, {"inputs": {"sentences": ["a big red cat"],
                                                      "constraints": ["GREEN"]}})
        assert status == 400 and "constraints" in refused["error"]
        assert "--no-keras-fallback" in refused["error"]
    finally:
        client.__exit__(None, None, None)


@pytest.mark.parametrize("body, status, said", [
    (b"{not json", 400, "JSON Parse error"),
    (b'{"instances": ["\xff\xfe"]}', 400, "JSON Parse error"),  # not UTF-8
    ({"instances": [{"sentences": "a"}], "inputs": {"sentences": ["a"]}}, 400, "Both"),
    ({"signature_name": "serving_default"}, 400, "Missing"),
    ({"inputs": {"sentences": "a dog"}}, 400, "list of strings"),
    ({"inputs": {"sentences": ["a"], "beam_size": "4"}}, 400, "must be an integer"),
    ({"inputs": {"sentences": ["a"], "beam_size": -1}}, 400, "beam_size=-1 must be at least 1"),
    ({"inputs": {"sentences": ["a"], "beam": 2}}, 400, "not in signature"),
    ({"signature_name": "translate", "inputs": {"sentences": ["a"]}}, 400, "not found"),
    ({"signature_name": "translate_nbest", "inputs": {"sentences": ["a"], "beam_size": 2,
                                                      "num_hypotheses": 3}}, 400, "from 1 to beam_size"),
    ({"inputs": {"sentences": ["a"], "prefixes": ["x", "y"]}}, 400, "one string per"),
    ({"inputs": {"sentences": ["a"], "top_k": 3}}, 400, "not in signature"),
    ({"signature_name": "sample", "inputs": {"sentences": ["a"], "top_p": 2.0}}, 400, "top_p"),
    ({"inputs": {"sentences": ["\ud800"]}}, 400, "UTF-8"),
    ({"instances": [{"sentences": "a"}] * 2000}, 413, "--max-lines"),
    ({"inputs": {"sentences": ["a " * 70000]}}, 413, "--max-words"),
])
def test_bad_requests_get_tensorflow_servings_error_shape(ct2_client, body, status, said):
    got, answer = predict(ct2_client, body)
    assert got == status and list(answer) == ["error"] and said in answer["error"], answer


def test_paths_models_versions_and_body_size(ct2_client):
    body = json.dumps({"inputs": {"sentences": ["a"]}})
    for path, status in (("/v1/models/other:predict", 404),
                         ("/v1/models/toy/versions/2:predict", 404),
                         ("/v1/models/toy:classify", 400), ("/v1/models/toy:predict/x", 400)):
        reply = ct2_client.post(path, content=body)
        assert reply.status_code == status and "error" in reply.json(), path
    reply = ct2_client.post("/v1/models/toy:predict", content=b" " * (2 << 20))
    assert reply.status_code == 413 and "--max-body-bytes" in reply.json()["error"]
    assert ct2_client.get("/v1/models/other").status_code == 404


def test_status_and_metadata_as_tensorflow_serving_answers_them(ct2_client):
    assert ct2_client.get("/v1/models/toy").json() == {"model_version_status": [
        {"version": "1", "state": "AVAILABLE",
         "status": {"error_code": "OK", "error_message": ""}}]}
    assert ct2_client.get("/v1/models/toy/versions/1").status_code == 200
    metadata = ct2_client.get("/v1/models/toy/metadata").json()
    assert metadata["model_spec"] == {"name": "toy", "signature_name": "", "version": "1"}
    defs = metadata["metadata"]["signature_def"]["signature_def"]
    assert sorted(defs) == ["sample", "score", "serving_default", "translate_nbest"]
    assert defs["serving_default"]["defaults"]["beam_size"]["int_val"] == [4]
    assert ct2_client.get("/healthz").status_code == 200
    assert ct2_client.get("/readyz").status_code == 200


def test_the_signatures_are_the_saved_models(ct2_client, toy_saved_model):
    """Input names, dtypes, shapes and defaults, and the outputs' dtypes and shapes, as the
    SavedModel's SignatureDefs hold them (read from its saved_model.pb)."""
    import tensorflow as tf
    from google.protobuf import json_format

    sys.path.insert(0, str(BENCHMARKS))
    from tf_serving import signature_defs

    ours = ct2_client.get("/v1/models/toy/metadata").json()["metadata"]["signature_def"][
        "signature_def"]
    saved = signature_defs(toy_saved_model)
    for name, signature in ours.items():
        theirs = json_format.MessageToDict(saved[name], preserving_proto_field_name=True)
        for side in ("inputs", "outputs"):
            assert sorted(signature[side]) == sorted(theirs[side]), (name, side)
            for alias, tensor in signature[side].items():
                assert tensor["dtype"] == theirs[side][alias]["dtype"], (name, alias)
                assert len(tensor["tensor_shape"]["dim"]) == len(
                    theirs[side][alias]["tensor_shape"].get("dim", [])), (name, alias)
                if side == "inputs":
                    assert tensor["name"] == theirs[side][alias]["name"], (name, alias)
        assert sorted(signature["defaults"]) == sorted(saved[name].defaults), name
        for alias, default in saved[name].defaults.items():
            value = tf.make_ndarray(default).tolist()
            field = [k for k in signature["defaults"][alias] if k.endswith("_val")][0]
            mine = signature["defaults"][alias][field]
            if default.dtype == tf.string.as_datatype_enum:
                assert value == [] and mine == [], (name, alias)
            else:
                assert mine == [pytest.approx(value)], (name, alias)


def test_api_keys_and_their_rate(tiny_run, ct2_export, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# one per line\nsecret-one\n", encoding="utf-8")
    client = served_client(tiny_run, engine="ctranslate2", ctranslate2_model=str(ct2_export),
                           keras_fallback=False, api_keys=str(keys), rate_limit=2)
    try:
        body = json.dumps({"inputs": {"sentences": ["a"]}})
        assert client.post("/v1/models/toy:predict", content=body).status_code == 401
        headers = {"Authorization": "Bearer secret-one"}
        codes = [client.post("/v1/models/toy:predict", content=body, headers=headers)
                 .status_code for _ in range(4)]
        assert codes[:2] == [200, 200] and 429 in codes
        assert client.get("/healthz").status_code == 200  # liveness needs no key
        metrics = client.get("/metrics").text
        assert 'serve_requests_total{route="predict",signature="serving_default",status="200"}' \
            in metrics and "secret" not in metrics
        assert "serve_batch_lines_bucket" in metrics and "serve_queue_lines" in metrics
    finally:
        client.__exit__(None, None, None)
