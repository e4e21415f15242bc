"""`serve` as clients meet it: a client written for the SavedModel in TensorFlow Serving gets
the same translations from `serve --engine keras`; the command itself on a loopback port,
answering concurrent clients, one access log line per request, and draining on SIGTERM."""

import http.client
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests.conftest import RUNTIME_CLI
from tests.test_serve import SENTENCES, ct2_export, predict, served_client  # noqa: F401
from tests.training_helpers import run_python

pytestmark = pytest.mark.slow  # trains the tiny run, exports it, starts servers

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
ROOT = BENCHMARKS.parent
PREFIXES = ["PARK THE", "", "WATER", ""]
# The same JSON bodies to TensorFlow Serving (its Predict handler, emulated in a TF1
# Session) and to `serve --engine keras`.
REQUESTS = [
    {"inputs": {"sentences": SENTENCES}},
    {"signature_name": "serving_default", "inputs": {"sentences": SENTENCES, "beam_size": 2,
                                                     "alpha": 1.0}},
    {"inputs": {"sentences": SENTENCES, "prefixes": PREFIXES}},
    {"inputs": {"sentences": SENTENCES, "constraints": ["PARK\tDOG", "", "BIG", ""]}},
    {"inputs": {"sentences": SENTENCES, "no_repeat_ngram_size": 2}},
    {"signature_name": "translate_nbest", "inputs": {"sentences": SENTENCES,
                                                     "num_hypotheses": 2}},
    {"signature_name": "score", "inputs": {"sources": SENTENCES[:3],
                                           "targets": ["KRAP EHT", "TAC", "RETAW"]}},
]
SESSION = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    benchmarks, directory, requests, output = sys.argv[1:5]
    sys.path.insert(0, benchmarks)
    from tf_serving import PredictHandler

    def plain(value):
        if isinstance(value, bytes):
            return value.decode("utf-8")
        return [plain(v) for v in value] if isinstance(value, list) else value

    handler = PredictHandler(directory)
    answers = []
    for request in json.load(open(requests, encoding="utf-8")):
        found = handler.predict(request["inputs"], request.get("signature_name",
                                                               "serving_default"))
        answers.append({k: plain(v.tolist()) for k, v in found.items()})
    json.dump(answers, open(output, "w", encoding="utf-8"))
""")


def test_a_tensorflow_serving_client_gets_the_same_translations(tiny_run, toy_saved_model,
                                                                tmp_path):
    (tmp_path / "requests.json").write_text(json.dumps(REQUESTS), encoding="utf-8")
    result = run_python("-c", SESSION, str(BENCHMARKS), str(toy_saved_model),
                        str(tmp_path / "requests.json"), str(tmp_path / "answers.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    expected = json.loads((tmp_path / "answers.json").read_text(encoding="utf-8"))
    client = served_client(tiny_run, engine="keras")
    try:
        for request, want in zip(REQUESTS, expected):
            status, answer = predict(client, request)
            assert status == 200, answer
            got = answer["outputs"]
            if "translations" in want:
                assert got["translations"] == want["translations"], request
                assert flat(got["scores"]) == pytest.approx(flat(want["scores"]), abs=1e-4)
            else:
                for name in ("log_prob", "tokens", "mean"):
                    assert got[name] == pytest.approx(want[name], abs=1e-4), request
        assert any(flat(expected[5]["translations"]))  # n-best lists: not all empty
    finally:
        client.__exit__(None, None, None)


def flat(values):
    return [v for row in values for v in row] if values and isinstance(values[0], list) \
        else values


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def send(port, body, timeout=60):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        connection.request("POST", "/v1/models/toy:predict", body=json.dumps(body),
                           headers={"Content-Type": "application/json"})
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read())
    finally:
        connection.close()


@pytest.fixture(scope="module")
def server(tiny_run, ct2_export, tmp_path_factory):
    """`keras-transformer serve` (CTranslate2 alone: no TensorFlow in the server) on a free
    loopback port, AVAILABLE; yields (process, port, stderr file). The SIGTERM test, last,
    stops it."""
    folder = ct2_export
    port, log = free_port(), tmp_path_factory.mktemp("serve") / "serve.log"
    process = subprocess.Popen(
        [sys.executable, *RUNTIME_CLI, "serve", "--run-dir", str(tiny_run), "--port",
         str(port), "--engine", "ctranslate2", "--ctranslate2-model", str(folder),
         "--no-keras-fallback", "--model-name", "toy"],
        stdout=subprocess.DEVNULL, stderr=open(log, "w"), cwd=ROOT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    deadline = time.monotonic() + 300
    while True:
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/readyz")
            if connection.getresponse().status == 200:
                break
        except OSError:
            pass
        time.sleep(0.2)
    yield process, port, log
    if process.poll() is None:
        process.kill()
        process.wait()


def test_concurrent_clients_get_their_own_answers(server):
    _, port, _ = server
    bodies = [{"inputs": {"sentences": [s] * (1 + i % 3)}} for i, s in
              enumerate(SENTENCES[:3] * 4)]
    alone = [send(port, body) for body in bodies]
    results = [None] * len(bodies)

    def client(index):
        results[index] = send(port, bodies[index])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == alone and all(status == 200 for status, _ in alone)


def test_sigterm_answers_what_was_accepted_then_exits_0(server):
    process, port, log = server
    logged_before = log.read_text().count('"POST /v1/models/toy:predict" 200')
    body = {"inputs": {"sentences": SENTENCES * 16}}
    expected = send(port, body)
    assert expected[0] == 200
    outcomes, stop, signalled = [], threading.Event(), []

    def client():
        while not stop.is_set():
            began = time.monotonic()
            try:
                outcomes.append((began, send(port, body, timeout=30)))
            except OSError as error:  # refused or closed: after the drain began
                outcomes.append((began, error))
                return

    threads = [threading.Thread(target=client) for _ in range(6)]
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    signalled.append(time.monotonic())
    process.send_signal(signal.SIGTERM)
    status = process.wait(timeout=10)
    ended = time.monotonic()
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    assert status == 0 and ended - signalled[0] < 10, log.read_text()[-2000:]
    before = [outcome for began, outcome in outcomes if began < signalled[0] - 0.05]
    assert len(before) > 6 and all(o == expected for o in before), before[:3]
    for began, outcome in outcomes:  # after it: answered, or refused; never a broken answer
        assert outcome == expected or isinstance(outcome, OSError) or (
            outcome[0] == 503 and "shutting down" in outcome[1]["error"]), outcome
    with pytest.raises(OSError):
        send(port, body, timeout=5)
    text = log.read_text()
    answered = sum(1 for _, o in outcomes if o == expected) + 1
    assert text.count('"POST /v1/models/toy:predict" 200') - logged_before == answered
    assert "AVAILABLE after its warm-up" in text and "drained and stopped" in text
