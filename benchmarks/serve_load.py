"""`keras-transformer serve` under load over loopback HTTP, beside CTranslate2 alone in one
process at its best setting and the run's SavedModel as TensorFlow Serving runs it, in the
same run.

    python benchmarks/serve_load.py --run-dir runs/multi30k-en-de-quick
    python benchmarks/serve_load.py --run-dir RUN --hostile --sigterm --memory-requests 10000
    python benchmarks/serve_load.py --run-dir RUN --tiny          # a smoke run

Phases (each figure from one run of the phase; the machine's load average is recorded):

    serve      the command (its defaults: the CTranslate2 engine, one worker per core) in a
               process of its own; 1, 8 and 32 HTTP clients (--clients), each with one
               keep-alive connection, sending its next request when its last is answered:
               --requests requests of --per-request sentences (Multi30k val, or --sentences)
               per client count, each phase bounded by --seconds. Requests/s, p50/p99
               latency, errors, and answers that differ from `keras-transformer translate
               --engine ctranslate2` on the same lines.
    anchors    benchmarks/serving_load.py's engines on the same requests and client counts:
               `ctranslate2 WxT` (CTranslate2 as its users serve it, one translate_batch per
               request, every threading setting; the best at each count) and `session` (the
               SavedModel in a TF1 Session, as TensorFlow Serving runs it); serve's
               requests/s and p99 over CTranslate2's best: `serve_vs_ctranslate2`.
    memory     (--memory-requests N) N requests from 32 clients: the server's resident
               memory (VmRSS) after a fifth of them and at the end; `rss_growth`.
    hostile    (--hostile) while 8 clients load the server, malformed JSON, wrong types, a
               10 MB body, a 100,000-line instance list, an unknown signature, model and
               version, invalid UTF-8, a negative beam and a client that sends half a body
               and stalls: each one's status, error shape and seconds; the load's errors.
    rounds     (--rounds R) serve and CTranslate2 alone again, in turn, R times: the median
               of each round's ratios (the machine's slow spells fall on both).
    sigterm    (--sigterm) a fresh server under 8 clients gets SIGTERM: requests sent before
               it all answered, those after refused (503 or a refused connection), its exit
               status and seconds to exit.

Prints one JSON line; exits 1 when an error, a wrong answer or a failed check was seen.
"""

import argparse
import http.client
import json
import multiprocessing
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import add_record_flag, append_result, emit  # noqa: E402
from ct2_reference import label, threading_grid  # noqa: E402
from serving_load import load_engine, make_requests, read_lines  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
# The command as it is installed (its entry point imports the package without Keras: a
# CTranslate2 server without the Keras engine loads no TensorFlow, as users run it).
COMMAND = [sys.executable, "-m", "keras_transformer_command"]


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`keras-transformer serve` in a process of its own, on a free loopback port."""

    def __init__(self, run_dir, extra=(), log=None):
        self.port = free_port()
        self.log = open(log or os.devnull, "w")
        self.process = subprocess.Popen(
            [*COMMAND, "serve", "--run-dir", str(run_dir), "--port", str(self.port),
             "--no-access-log", *extra], stdout=self.log, stderr=self.log, cwd=ROOT)
        deadline = time.monotonic() + 600
        while not self.ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"serve did not become ready (exit {self.process.poll()})")
            time.sleep(0.2)
        self.name = model_name(self.port)

    def ready(self):
        try:
            return get(self.port, "/readyz")[0] == 200
        except OSError:
            return False

    def rss_mb(self):
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return round(int(line.split()[1]) / 1024, 1)

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=30)
        self.log.close()


def get(port, path):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path)
        reply = connection.getresponse()
        return reply.status, reply.read()
    finally:
        connection.close()


def model_name(port):
    """The model's name, from the page's script (the one model the server holds)."""
    page = get(port, "/")[1].decode("utf-8")
    return json.loads(page.split("const MODEL = ", 1)[1].split(",", 1)[0])


class Client:
    """One keep-alive connection sending predict requests; reconnects after an error."""

    def __init__(self, port, name):
        self.port, self.path, self.connection = port, f"/v1/models/{name}:predict", None

    def predict(self, body, timeout=60):
        """(status, answer or error text, seconds)."""
        began = time.perf_counter()
        try:
            if self.connection is None:
                self.connection = http.client.HTTPConnection("127.0.0.1", self.port,
                                                             timeout=timeout)
            self.connection.request("POST", self.path, body=body,
                                    headers={"Content-Type": "application/json"})
            reply = self.connection.getresponse()
            status, data = reply.status, reply.read()
            if reply.getheader("connection", "").lower() == "close":
                self.close()
            return status, json.loads(data), time.perf_counter() - began
        except (OSError, http.client.HTTPException, ValueError) as error:
            self.close()
            return None, f"{type(error).__name__}: {error}", time.perf_counter() - began

    def close(self):
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def load(port, name, requests, clients, seconds, stop=None):
    """Sends `requests` (lists of sentences) from `clients` threads, each its next request
    when its last is answered, for at most `seconds` (or until `stop` is set). Returns
    [(index, status, answer, seconds, start time)] of the requests sent, and the wall time."""
    bodies = [json.dumps({"inputs": {"sentences": r}}) for r in requests]
    results, lock, position = [], threading.Lock(), [0]
    deadline = time.monotonic() + seconds

    def work():
        client = Client(port, name)
        while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
            with lock:
                index = position[0]
                position[0] += 1
            if index >= len(bodies):
                break
            began = time.monotonic()
            status, answer, took = client.predict(bodies[index])
            with lock:
                results.append((index, status, answer, took, began))
        client.close()

    began = time.perf_counter()
    threads = [threading.Thread(target=work) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results, time.perf_counter() - began


def figures(results, wall, requests, expected):
    """requests/s, p50/p99 ms, errors and answers unlike `translate`'s of a load."""
    latencies = sorted(took * 1000 for _, status, _, took, _ in results if status == 200)
    errors = [answer for _, status, answer, _, _ in results if status != 200]
    wrong = sum(1 for index, status, answer, _, _ in results if status == 200 and
                answer["outputs"]["translations"] != [expected[s] for s in requests[index]])
    return {"requests": len(results), "requests_per_s": round(len(results) / wall, 2),
            "p50_ms": round(statistics.median(latencies), 1) if latencies else None,
            "p99_ms": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1)
            if latencies else None, "errors": len(errors), "first_error": str(errors[0])[:300]
            if errors else None, "unlike_translate": wrong}


def translations(run_dir, sentences, folder, extra):
    """{sentence: its translation by `keras-transformer translate --engine ctranslate2`}."""
    unique = sorted(set(sentences))
    source, output = folder / "unique.txt", folder / "translated.txt"
    source.write_text("\n".join(unique) + "\n", encoding="utf-8")
    subprocess.run([*COMMAND, "translate", "--run-dir", str(run_dir), "--engine",
                    "ctranslate2", *extra, "--input", str(source), "--output", str(output)],
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return dict(zip(unique, output.read_text(encoding="utf-8").split("\n")))


def serve_phase(args, requests, expected, extra, memory=True):
    """serve's figures at each client count (and the memory phase)."""
    server = Server(args.run_dir, extra)
    record = {"rss_mb_ready": server.rss_mb(), "clients": {}}
    try:
        for count in args.clients:
            results, wall = load(server.port, server.name, requests, count, args.seconds)
            record["clients"][str(count)] = figures(results, wall, requests, expected)
            print(f"serve, {count} clients: {record['clients'][str(count)]}", file=sys.stderr,
                  flush=True)
        if args.memory_requests and memory:
            record["memory"] = memory_phase(server, requests, expected, args.memory_requests)
    finally:
        server.stop()
    return record


def memory_phase(server, requests, expected, count):
    """`count` requests from 32 clients: VmRSS after a fifth of them and at the end."""
    many = [requests[i % len(requests)] for i in range(count)]
    parts = []
    for part in (many[: count // 5], many[count // 5:]):  # each part's indexes its own
        results, wall = load(server.port, server.name, part, 32, 3600)
        parts.append((figures(results, wall, part, expected), wall, server.rss_mb()))
    (first, wall_first, after_fifth), (rest, wall_rest, at_end) = parts
    return {"requests": count, "requests_per_s": round(count / (wall_first + wall_rest), 2),
            "errors": first["errors"] + rest["errors"],
            "unlike_translate": first["unlike_translate"] + rest["unlike_translate"],
            "p99_ms_last_part": rest["p99_ms"], "rss_mb_after_fifth": after_fifth,
            "rss_mb_at_end": at_end, "rss_growth": round(at_end / after_fifth - 1, 4)}


def anchors(args, requests, paths, search, session=True):
    """serving_load's engines on the same requests, each in a fresh process: CTranslate2 at
    every threading setting, and the SavedModel in a TF1 Session."""
    records, counts = {}, [1] + [c for c in args.clients if c != 1]
    runs = [(f"ctranslate2 {label(s)}", "ctranslate2", s) for s in threading_grid()]
    if paths.get("saved_model") and not args.ctranslate2_only and session:
        runs.append(("session", "session", (0, 0)))
    for name, engine, pools in runs:
        context = multiprocessing.get_context("spawn")
        with context.Pool(1) as pool:
            records[name] = pool.apply(load_engine, (
                engine, paths, requests, counts, pools, {},
                search if engine == "ctranslate2" else None))
    return records


def best_ctranslate2(records):
    """{count: (setting, its figures)} of the fastest CTranslate2 setting at each count
    (CTranslate2's own defaults aside)."""
    settings = {n: r["threads"] for n, r in records.items()
                if n.startswith("ctranslate2 ") and "defaults" not in n}
    counts = next(iter(settings.values()))
    return {count: max(((n, s[count]) for n, s in settings.items()),
                       key=lambda item: item[1]["requests_per_s"]) for count in counts}


def hostile_requests(name):
    """(what, raw HTTP request bytes, seconds to stall after sending) of each hostile one."""
    def post(body, path=f"/v1/models/{name}:predict", length=None):
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                f"\r\nContent-Length: {len(body) if length is None else length}\r\n\r\n")
        return head.encode("ascii") + body

    big = b'{"inputs": {"sentences": ["' + b"a " * (5 << 20) + b'"]}}'
    lines = json.dumps({"instances": [{"sentences": "a"}] * 100000}).encode()
    return [
        ("malformed JSON", post(b'{"inputs": {"sentences": ["a"'), 0),
        ("wrong types", post(b'{"inputs": {"sentences": [1, 2], "beam_size": "four"}}'), 0),
        ("10 MB body", post(big), 0),
        ("100,000-line instance list", post(lines), 0),
        ("unknown signature", post(b'{"signature_name": "nope", "inputs": {"sentences": '
                                   b'["a"]}}'), 0),
        ("unknown model", post(b'{"inputs": {"sentences": ["a"]}}',
                               "/v1/models/nope:predict"), 0),
        ("unknown version", post(b'{"inputs": {"sentences": ["a"]}}',
                                 f"/v1/models/{name}/versions/99:predict"), 0),
        ("invalid UTF-8", post(b'{"inputs": {"sentences": ["\xff\xfe bad"]}}'), 0),
        ("negative beam", post(b'{"inputs": {"sentences": ["a"], "beam_size": -4}}'), 0),
        ("half a body, then a stall", post(b'{"inputs": {"sente', length=400), 30),
    ]


def send_raw(port, data, stall):
    """(status, body, seconds) of a raw request (the connection kept open for up to
    `stall` seconds after sending, as a stalled client does)."""
    began = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=stall + 30) as sock:
        sock.sendall(data)
        received = b""
        while b"\r\n\r\n" not in received or len(received) < _length(received):
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else None
    return status, body, time.perf_counter() - began


def _length(received):
    head, _, _ = received.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(head) + 4 + int(line.split(b":")[1])
    return len(received) + 1


def hostile_phase(args, requests, expected, extra):
    """Each hostile request while 8 clients load the server: its status, whether the body
    is TensorFlow Serving's error shape, its seconds; and the load's figures."""
    server = Server(args.run_dir, extra)
    stop, found = threading.Event(), []
    try:
        loaded = {}

        def background():
            loaded["results"] = load(server.port, server.name, requests * 100, 8, 3600, stop)

        thread = threading.Thread(target=background)
        thread.start()
        time.sleep(1)
        for what, data, stall in hostile_requests(server.name):
            try:
                status, body, took = send_raw(server.port, data, stall)
                shape = list(json.loads(body)) == ["error"]
            except (OSError, ValueError) as error:
                status, shape, took = f"{type(error).__name__}: {error}", False, None
            found.append({"request": what, "status": status, "error_shape": shape,
                          "seconds": round(took, 3) if took is not None else None})
            print(f"hostile: {found[-1]}", file=sys.stderr, flush=True)
        stop.set()
        thread.join()
    finally:
        server.stop()
    results, wall = loaded["results"]
    return {"requests": found, "load": figures(results, wall, requests * 100, expected),
            "ok": all(isinstance(r["status"], int) and 400 <= r["status"] < 500
                      and r["error_shape"] for r in found)}


def sigterm_phase(args, requests, expected, extra):
    """SIGTERM to a server under 8 clients: what was sent before it answered, what after
    refused, the exit status and the seconds to exit."""
    server = Server(args.run_dir, extra)
    stop, loaded = threading.Event(), {}
    thread = threading.Thread(target=lambda: loaded.update(results=load(
        server.port, server.name, requests * 100, 8, 3600, stop)))
    thread.start()
    time.sleep(3)
    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    try:
        status = server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        status = "still running after 30 s"
    exit_seconds = time.monotonic() - signalled
    time.sleep(0.5)
    stop.set()
    thread.join()
    server.log.close()
    results, _ = loaded["results"]
    before = [r for r in results if r[4] < signalled - 0.01]
    after = [r for r in results if r[4] >= signalled - 0.01]
    answered = sum(1 for index, code, answer, _, _ in before if code == 200 and answer[
        "outputs"]["translations"] == [expected[s] for s in requests[index % len(requests)]])
    refused_later = sum(1 for _, code, _, _, _ in after if code in (None, 503))
    try:
        get(server.port, "/healthz")
        closed = False
    except OSError:
        closed = True
    return {"sent_before": len(before), "answered_before": answered, "sent_after":
            len(after), "refused_after": refused_later, "exit_status": status,
            "seconds_to_exit": round(exit_seconds, 2), "port_closed_after": closed,
            "ok": answered == len(before) and status == 0 and exit_seconds <= 10 and closed}


def search_of(run_dir):
    """{beam_size, alpha} of the run's saved choice (what serve and translate search with)."""
    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.runs import open_run

    request = Decoder.resolve(open_run(run_dir)).request
    return {"beam_size": request.beam_size, "alpha": request.alpha}


def exports_of(args):
    """{"ctranslate2", "saved_model"} paths: given, else the run's default places."""
    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.defaults import export_base
    from keras_transformer.runs import open_run

    run = open_run(args.run_dir)
    paths = {"ctranslate2": args.ctranslate2_model or Decoder(run=run).run_ctranslate2_export()}
    saved = args.saved_model
    if saved is None:
        base = export_base(run.directory)
        versions = sorted((p for p in base.glob("*") if p.name.isdigit()),
                          key=lambda p: int(p.name)) if base.is_dir() else []
        saved = versions[-1] if versions else None
    paths["saved_model"] = saved
    if paths["ctranslate2"] is None:
        raise SystemExit("the run has no CTranslate2 export: keras-transformer export "
                         "--format ctranslate2 --quantize int8 (or give --ctranslate2-model)")
    return {k: str(v) for k, v in paths.items() if v is not None}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, help="a trained run with exports")
    parser.add_argument("--ctranslate2-model", help="its CTranslate2 export (default: the "
                        "run's, saved_models/NAME/ctranslate2-int8, else ctranslate2)")
    parser.add_argument("--saved-model", help="its SavedModel version folder (default: the "
                        "newest under saved_models/NAME/)")
    parser.add_argument("--sentences", help="sentences to send (default: Multi30k val.en)")
    parser.add_argument("--per-request", type=int, default=3, help="sentences a request (3)")
    parser.add_argument("--clients", default="1,8,32", help="client counts (1,8,32)")
    parser.add_argument("--requests", type=int, default=600,
                        help="requests per client count (600)")
    parser.add_argument("--seconds", type=float, default=120,
                        help="the most seconds a client count's load runs (120)")
    parser.add_argument("--memory-requests", type=int, default=0,
                        help="the memory phase's requests from 32 clients (0: no phase)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="more than 1: serve and CTranslate2 alone measured that many "
                        "more times, in turn, and the median ratios (a busy machine)")
    parser.add_argument("--hostile", action="store_true", help="the hostile phase")
    parser.add_argument("--sigterm", action="store_true", help="the SIGTERM phase")
    parser.add_argument("--no-anchors", action="store_true",
                        help="leave out CTranslate2 alone and the SavedModel's session")
    parser.add_argument("--ctranslate2-only", action="store_true",
                        help="anchors: CTranslate2 alone only, not the SavedModel as TensorFlow Serving runs it")
    parser.add_argument("--serve-args", default="",
                        help="more flags for serve, e.g. '--no-keras-fallback'")
    parser.add_argument("--tiny", action="store_true", help="a smoke run: 30 requests a count")
    add_record_flag(parser, "serve_load")
    args = parser.parse_args(argv)
    args.clients = [int(c) for c in args.clients.split(",")]
    if args.tiny:
        args.requests, args.seconds = 30, 30
    return run(args)


def run(args):
    load_before = os.getloadavg()
    paths = exports_of(args)
    extra = ["--ctranslate2-model", paths["ctranslate2"]]
    source = args.sentences or MULTI30K / "val.en.gz"
    sentences = [s for s in read_lines(source) if s.strip()]
    requests = make_requests(sentences, args.requests, args.per_request)
    with tempfile.TemporaryDirectory() as folder:
        expected = translations(args.run_dir, [s for r in requests for s in r],
                                pathlib.Path(folder), extra)
    serve_extra = [*extra, *args.serve_args.split()]
    record = {"benchmark": "serve_load", "exports": paths, "sentences_from": str(source),
              "per_request": args.per_request, "requests_per_count": args.requests,
              "serve": serve_phase(args, requests, expected, serve_extra)}
    if not args.no_anchors:
        record["anchors"] = anchors(args, requests, paths, search_of(args.run_dir))
        record["serve_vs_ctranslate2"] = compared(record)
    if args.rounds > 1:
        record["alternating"] = alternating(args, requests, expected, paths, serve_extra)
    if args.hostile:
        record["hostile"] = hostile_phase(args, requests, expected, serve_extra)
    if args.sigterm:
        record["sigterm"] = sigterm_phase(args, requests, expected, serve_extra)
    from keras_transformer.hardware import cpu_class, cpu_model

    record.update(cpu_class=cpu_class(), cpu=cpu_model(), cores=os.cpu_count(),
                  load_average=[round(x, 1) for x in (*load_before, *os.getloadavg())])
    record["ok"] = ok(record)
    line = emit(record)
    if args.record:
        append_result("serve_load", line)
    return 0 if record["ok"] else 1


def alternating(args, requests, expected, paths, extra):
    """--rounds R: serve and CTranslate2 alone (every setting) in turn, R more times, so that
    a busy machine's slow spells fall on both: each round's ratios and their medians."""
    rounds, search = [], search_of(args.run_dir)
    for _ in range(args.rounds):
        served = serve_phase(args, requests, expected, extra, memory=False)
        alone = anchors(args, requests, paths, search, session=False)
        rounds.append(compared({"serve": served, "anchors": alone}))
        rounds[-1]["serve_errors"] = sum(f["errors"] + f["unlike_translate"]
                                         for f in served["clients"].values())
    counts = [count for count in rounds[0] if count != "serve_errors"]
    return {"rounds": rounds, "median": {count: {
        name: round(statistics.median(r[count][name] for r in rounds), 3)
        for name in ("requests_per_s", "p99")} for count in counts}}


def compared(record):
    """Per client count: serve's requests/s and p99 over CTranslate2's best setting's."""
    best, ratios = best_ctranslate2(record["anchors"]), {}
    for count, figures_ in record["serve"]["clients"].items():
        if count in best:
            setting, theirs = best[count]
            ratios[count] = {"ctranslate2_best": setting,
                             "requests_per_s": round(figures_["requests_per_s"]
                                                     / theirs["requests_per_s"], 3),
                             "p99": round(figures_["p99_ms"] / theirs["p99_ms"], 3)}
    return ratios


def ok(record):
    serve = record["serve"]
    good = all(f["errors"] == 0 and f["unlike_translate"] == 0
               for f in serve["clients"].values())
    memory = serve.get("memory")
    if memory is not None:
        good &= memory["errors"] == 0 and memory["unlike_translate"] == 0 \
            and memory["rss_growth"] <= 0.05
    if "alternating" in record:
        good &= not any(r["serve_errors"] for r in record["alternating"]["rounds"])
    for phase in ("hostile", "sigterm"):
        if phase in record:
            good &= record[phase]["ok"]
    if "hostile" in record:
        good &= record["hostile"]["load"]["errors"] == 0
    return bool(good)


if __name__ == "__main__":
    sys.exit(main())
