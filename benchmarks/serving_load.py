"""Serving under load: one loaded model shared by client threads, as a server holds it, for a
fixed count of requests per thread count; every answer checked against the single-threaded one.

    python benchmarks/serving_load.py                       # trains a tiny run on Multi30k first
    python benchmarks/serving_load.py --run-dir RUN         # exports RUN, then loads the exports
    python benchmarks/serving_load.py --saved-model EXPORTS/NAME/1 \
        --ctranslate2-model EXPORTS/NAME/ctranslate2 --sentences lines.txt  # no training
    python benchmarks/serving_load.py --tiny                # a smoke run (few requests)

Engines (--engines, comma-separated; each in a fresh process of its own, the CTranslate2 ones
without TensorFlow, so that its peak RSS is its own):

    session      TensorFlow Serving's way, on the default export (its text signatures batch
                 concurrent requests in the graph): the SavedModel in a TF1 Session
                 (tf.compat.v1.saved_model.loader.load, tags "serve") shared by the client
                 threads; a request gives only `sentences`, the other inputs come from the
                 SignatureDef's `defaults`, as TF Serving's Predict handler fills them.
    session-unbatched  the same on an export made with --no-batching (each request alone).
    function     a Python server's way: tf.saved_model.load once, `serving_default` called with
                 every input (a Python call applies no defaults: they are read from the same
                 SignatureDef).
    ctranslate2  CTranslate2 itself as its users serve it (`ct2_reference.Reference`): the
                 run's int8 export loaded once, one `translate_batch` per request (the
                 SavedModel's default beam and alpha, else the request's defaults), once per
                 threading setting (`ct2_reference.threading_grid`), each kept under
                 `ctranslate2 WxT`; the best at each client thread count: `ctranslate2_best`.
    ctranslate2-lane  our CTranslate2 engine (`Decoder(Request(engine="ctranslate2"))`, its
                 default workers and threads) on the same export and search.

For each thread count (1, 2, 4, 8) the same --requests requests (--per-request real sentences
each: Multi30k val when ../shared/data/multi30k is there, else --sentences or the run's dev
source) are sent by that many client threads, each sending its next request when its last is
answered. The thread count 1 pass gives the reference answers; in the other passes an answer
whose translations differ, or whose scores differ by more than 1e-5, counts as a mismatch.
Per thread count: requests/s and sentences/s over the pass's wall time, their ratio to one
thread's (`vs_1_thread`), p50/p99 latency of a request, errors, mismatches. Peak RSS (VmHWM)
is read after a fifth of the engine's requests and after all of them: with the default 1250
requests, after 1,000 and after 5,000; `rss_growth` is the second over the first, minus 1
(<= 0.05 passes). `nonempty_translations` is the share of the reference answers'
translations that are not empty (a model answering only "" would make the answer check
empty).

The server's thread pools: `--intra-op-threads N` and `--inter-op-threads N` are TensorFlow
Serving's `--tensorflow_intra_op_parallelism` and `--tensorflow_inter_op_parallelism` for the
session and function engines (0, the default: TensorFlow's choice, every core for each);
`--intra-op-threads 1` is what docs/export.md recommends for serving (a few rows per search).
`--no-onednn` starts the engines' processes with TF_ENABLE_ONEDNN_OPTS=0 (the recommended
server environment: oneDNN's per-thread primitive caches grow with every new shape of a
float32 search). Each record's `onednn` says which ran.

Beside CTranslate2, each other engine's requests/s over CTranslate2's best setting at each
thread count: `session_ratio_vs_ctranslate2`, `ctranslate2-lane_ratio_vs_ctranslate2` and so on
(> 1: faster).

Prints one JSON line (cpu_class, load average before and after); exits 1 when any engine has
an error, a mismatch or RSS growth over 5%. The Session and function engines are
benchmarks/tf_serving.py's handlers (`PredictHandler`: TF Serving's, emulated).
"""

import argparse
import contextlib
import gzip
import multiprocessing
import os
import pathlib
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import add_record_flag, append_result, emit  # noqa: E402
from ct2_reference import DEFAULTS, Reference, label, peak_rss_mb, threading_grid  # noqa: E402
from tf_serving import FunctionHandler, PredictHandler, signature_defs  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
ENGINES = ("session", "session-unbatched", "function", "ctranslate2", "ctranslate2-lane")
# The export each engine loads (its key in `prepare`'s paths).
EXPORT_OF = {"session": "saved_model", "session-unbatched": "saved_model_unbatched",
             "function": "saved_model", "ctranslate2": "ctranslate2",
             "ctranslate2-lane": "ctranslate2"}
THREAD_COUNTS = (1, 2, 4, 8)
SCORE_TOLERANCE = 1e-5
MAX_RSS_GROWTH = 0.05


def engine_answer(engine, paths, pools=(0, 0), search=None):
    """A function sentences -> (translations, scores or None) for `engine`, loaded once;
    `pools`: (intra-op, inter-op) threads of a TensorFlow engine (0: TensorFlow's choice);
    `search`: the CTranslate2 engines' beam_size and alpha (read by the parent process,
    `signature_defaults`; None: the request's defaults)."""
    if engine == "ctranslate2":
        return ctranslate2_answer(paths, pools, search)
    if engine != "ctranslate2-lane":
        handler = (FunctionHandler if engine == "function" else PredictHandler)(
            paths[EXPORT_OF[engine]], intra_op_threads=pools[0], inter_op_threads=pools[1])

        def answer(sentences):
            result = handler.predict({"sentences": sentences})
            return ([t.decode("utf-8") for t in result["translations"]],
                    [float(s) for s in result["scores"]])

        return answer
    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.decoding.request import Request

    translator = Decoder(Request(engine="ctranslate2", ctranslate2_model=str(
        paths["ctranslate2"]), **(search or {}))).engine()
    return lambda sentences: (translator.translate(sentences), None)


def ctranslate2_answer(paths, setting, search=None):
    """CTranslate2 as its users serve it (`ct2_reference.Reference`): one Translator of
    `setting` (workers, threads), one translate_batch per request (the GIL released:
    concurrent requests run on the workers); `search` as `engine_answer` takes it."""
    search = search or {}
    reference = Reference(paths["ctranslate2"], *setting, beam=search.get("beam_size", 4),
                          alpha=search.get("alpha", 0.6))
    return lambda sentences: (reference.translate(sentences), None)


def signature_defaults(export_dir):
    """{"beam_size", "alpha"}: the defaults of a SavedModel's serving_default (the search a
    request that leaves them out gets), so that CTranslate2 runs the same search."""
    import tensorflow as tf

    defaults = signature_defs(export_dir)["serving_default"].defaults
    return {name: tf.make_ndarray(defaults[name]).item() for name in ("beam_size", "alpha")
            if name in defaults}


def differs(answer, reference):
    """True when `answer` is not the reference answer (texts equal, scores within tolerance)."""
    (texts, scores), (want_texts, want_scores) = answer, reference
    if texts != want_texts:
        return True
    return scores is not None and any(abs(a - b) > SCORE_TOLERANCE
                                      for a, b in zip(scores, want_scores))


def load_engine(engine, paths, requests, thread_counts, pools=(0, 0), environ=None,
                search=None):
    """Runs in a fresh process: loads `engine` (a TensorFlow one with `pools`, and `environ`
    set before TensorFlow starts; a CTranslate2 one with `search`, read by the parent, so
    that its process imports no TensorFlow), then sends `requests` from each thread count's
    threads in turn. Returns the engine's record."""
    os.environ.update(environ or {})  # this process has not loaded TensorFlow yet
    start = time.perf_counter()
    answer = engine_answer(engine, paths, pools, search)
    answer(requests[0])  # warm-up, not counted: the first run optimizes the graph
    record = {"load_and_warmup_s": round(time.perf_counter() - start, 2), "threads": {}}
    if engine == "ctranslate2":
        record["setting"] = label(pools)  # CTranslate2's workers x threads
    elif engine != "ctranslate2-lane":
        # (imported here: keras_transformer imports TensorFlow, which a CTranslate2 engine's
        # process never loads, so that its peak RSS is CTranslate2's alone)
        from keras_transformer.hardware import onednn_on

        record["intra_op_threads"], record["inter_op_threads"] = pools
        record["onednn"] = onednn_on()
    total = len(requests) * len(thread_counts)
    marks = {max(1, total // 5), total}
    rss, done, lock = {}, [0], threading.Lock()
    reference, first_error = [None] * len(requests), None

    def send(index):
        began = time.perf_counter()
        try:
            result = answer(requests[index])
            error = None
        except Exception as failure:  # counted and reported, the load goes on
            result, error = None, f"{type(failure).__name__}: {failure}"[:500]
        took = time.perf_counter() - began
        with lock:
            done[0] += 1
            if done[0] in marks:
                rss[str(done[0])] = peak_rss_mb()
        return index, result, took, error

    for count in thread_counts:
        began = time.perf_counter()
        with ThreadPoolExecutor(count) as pool:
            results = list(pool.map(send, range(len(requests))))
        wall = time.perf_counter() - began
        errors = mismatches = 0
        for index, result, _, error in results:
            if error is not None:
                errors += 1
                first_error = first_error or error
            elif reference[index] is None:
                reference[index] = result  # the first (single-threaded) answer
            elif differs(result, reference[index]):
                mismatches += 1
        latencies = sorted(took * 1000 for _, _, took, _ in results)
        record["threads"][str(count)] = {
            "requests_per_s": round(len(requests) / wall, 2),
            "sentences_per_s": round(sum(len(r) for r in requests) / wall, 1),
            "vs_1_thread": round(len(requests) / wall / record["threads"]["1"][
                "requests_per_s"], 2) if count != 1 else 1.0,
            "p50_ms": round(statistics.median(latencies), 1),
            "p99_ms": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 1),
            "errors": errors, "mismatches": mismatches}
        print(f"{engine}, {count} threads: {record['threads'][str(count)]}", file=sys.stderr,
              flush=True)
    growth = rss[str(total)] / rss[str(max(1, total // 5))] - 1
    texts = [t for answer in reference if answer is not None for t in answer[0]]
    record.update({"requests": total, "peak_rss_mb_after": rss, "rss_growth": round(growth, 4),
                   "nonempty_translations": round(sum(map(bool, texts)) / max(1, len(texts)),
                                                  3),
                   "first_error": first_error,
                   "ok": growth <= MAX_RSS_GROWTH and not first_error and not any(
                       t["mismatches"] for t in record["threads"].values())})
    return record


def ratios_vs_ctranslate2(engines):
    """Per engine and thread count, its requests/s over the best CTranslate2 setting's (the
    engines `ctranslate2 WxT`, CTranslate2's defaults aside) at that thread count (> 1:
    faster), under `<engine>_ratio_vs_ctranslate2`, with the setting that won
    (`ctranslate2_best`) and its rate; nothing without CTranslate2."""
    settings = {name.split(" ", 1)[1]: engine["threads"] for name, engine in engines.items()
                if name.startswith("ctranslate2 ") and label(DEFAULTS) not in name}
    if not settings:
        return {}
    counts = next(iter(settings.values()))
    best = {count: max(settings, key=lambda s: settings[s][count]["requests_per_s"])
            for count in counts}
    rate = {count: settings[best[count]][count]["requests_per_s"] for count in counts}
    ratios = {f"{name}_ratio_vs_ctranslate2": {
        count: round(figures["requests_per_s"] / rate[count], 3)
        for count, figures in engine["threads"].items() if count in rate}
        for name, engine in engines.items() if not name.startswith("ctranslate2 ")}
    return {**ratios, "ctranslate2_best": best, "ctranslate2_best_requests_per_s": rate}


def read_lines(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for line in handle if line.strip()]


def make_requests(sentences, count, per_request):
    """`count` requests of `per_request` consecutive sentences, cycling through `sentences`."""
    return [[sentences[(i * per_request + j) % len(sentences)] for j in range(per_request)]
            for i in range(count)]


def train_tiny_run(folder, steps):
    """A tiny run trained `steps` steps on the first 8000 Multi30k en-de pairs (real vocabulary
    and sentence lengths; the translations' quality does not matter here)."""
    from keras_transformer.runs import make_config
    from keras_transformer.training import train
    from pipelines.files import atomic_path

    if not (MULTI30K / "train.en.gz").is_file():
        raise SystemExit(f"no Multi30k at {MULTI30K}: pass --run-dir (a trained run) or "
                         "--saved-model/--ctranslate2-model/--sentences (exports).")
    files = {}
    for split, lang, lines in (("train", "en", 8000), ("train", "de", 8000),
                               ("val", "en", None), ("val", "de", None)):
        files[split, lang] = folder / f"{split}.{lang}"
        with atomic_path(files[split, lang]) as temporary:
            temporary.write_text("\n".join(read_lines(MULTI30K / f"{split}.{lang}.gz")[:lines])
                                 + "\n", encoding="utf-8")
    # The prepared data goes with the run (not ~/.cache), unless the caller chose a cache.
    os.environ.setdefault("KERAS_TRANSFORMER_DATA_CACHE", str(folder / "data-cache"))
    config = make_config(
        preset="tiny", dataset="text", train_src=str(files["train", "en"]),
        train_tgt=str(files["train", "de"]), dev_src=str(files["val", "en"]),
        dev_tgt=str(files["val", "de"]), vocab_size=1000, tokens_per_batch=2048,
        warmup_steps=min(100, steps), train_steps=steps, eval_steps=steps,
        checkpoint_steps=steps, verbose=0, precision="float32",
        output_dir=str(folder / "run"))
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries only the JSON line
        train(config)
    return folder / "run"


def prepare(args, folder):
    """{"saved_model", "saved_model_unbatched", "ctranslate2"} export paths and the
    sentences to send."""
    paths = {"saved_model": args.saved_model, "ctranslate2": args.ctranslate2_model,
             "saved_model_unbatched": args.unbatched_saved_model}
    run_dir = args.run_dir
    needed = [EXPORT_OF[e] for e in args.engines]
    if any(paths[n] is None for n in needed):
        from keras_transformer import export
        from keras_transformer.decoding.decoder import Decoder
        from keras_transformer.decoding.request import EXPORT
        from keras_transformer.runs import open_run

        run_dir = run_dir or train_tiny_run(folder, args.train_steps)
        decoder = Decoder.resolve(open_run(run_dir), command=EXPORT)
        for name, format, extra in (
                ("saved_model", "savedmodel", {}),
                ("saved_model_unbatched", "savedmodel", {"batching": None}),
                ("ctranslate2", "ctranslate2", {"quantize": "int8"})):
            if paths[name] is None and name in needed:
                paths[name] = export.export_run(decoder, format=format,
                                                output_dir=folder / "exports",
                                                name=f"serving-{name}", **extra)
    if args.sentences:
        source = args.sentences
    elif (MULTI30K / "val.en.gz").is_file():
        source = MULTI30K / "val.en.gz"
    elif run_dir is not None:
        from keras_transformer.runs import open_run

        source = open_run(run_dir).config.dev_src
    else:
        raise SystemExit("no sentences to send: pass --sentences FILE (one per line).")
    return {k: str(v) for k, v in paths.items() if v is not None}, source, read_lines(source)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", default="session,ctranslate2",
                        help=f"comma-separated among {', '.join(ENGINES)} (session,ctranslate2)")
    parser.add_argument("--requests", type=int, default=1250,
                        help="requests per thread count (1250: 5,000 per engine)")
    parser.add_argument("--per-request", type=int, default=3, help="sentences per request (3)")
    parser.add_argument("--threads", default=",".join(map(str, THREAD_COUNTS)),
                        help="client thread counts, comma-separated, 1 first (1,2,4,8)")
    parser.add_argument("--run-dir", help="a trained run to export (default: train a tiny one)")
    parser.add_argument("--train-steps", type=int, default=300,
                        help="steps of the tiny run trained without --run-dir (300)")
    parser.add_argument("--saved-model", help="an existing SavedModel export (skips exporting)")
    parser.add_argument("--unbatched-saved-model",
                        help="an existing SavedModel exported with --no-batching (for the "
                        "session-unbatched engine)")
    parser.add_argument("--ctranslate2-model", help="an existing CTranslate2 export")
    parser.add_argument("--sentences", help="a text file (or .gz) of sentences to send "
                        "(default: Multi30k val.en, else the run's dev source)")
    parser.add_argument("--work-dir", help="where the run and exports go (default: a "
                        "temporary folder, removed at the end)")
    parser.add_argument("--intra-op-threads", type=int, default=0, metavar="N",
                        help="the TensorFlow engines' intra-op threads, as TensorFlow Serving's "
                        "--tensorflow_intra_op_parallelism (0: TensorFlow's choice; 1 is "
                        "the setting docs/export.md recommends for serving)")
    parser.add_argument("--inter-op-threads", type=int, default=0, metavar="N",
                        help="the TensorFlow engines' inter-op threads, as TensorFlow Serving's "
                        "--tensorflow_inter_op_parallelism (0: TensorFlow's choice)")
    parser.add_argument("--no-onednn", action="store_true",
                        help="run the engines with TF_ENABLE_ONEDNN_OPTS=0 (TensorFlow's own "
                        "kernels; the server environment docs/export.md recommends)")
    parser.add_argument("--tiny", action="store_true",
                        help="a smoke run: 10 requests per thread count, 30 training steps")
    add_record_flag(parser, "serving_load")
    args = parser.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    thread_counts = [int(t) for t in args.threads.split(",")]
    if not args.engines or set(args.engines) - set(ENGINES):
        parser.error(f"--engines {','.join(args.engines)!r}: choose among {', '.join(ENGINES)}")
    if thread_counts[0] != 1 or min(thread_counts) < 1:
        parser.error(f"--threads {args.threads!r}: counts >= 1, starting with 1 (the reference)")
    if min(args.intra_op_threads, args.inter_op_threads) < 0:
        parser.error("--intra-op-threads/--inter-op-threads: 0 (TensorFlow's choice) or more")
    if args.tiny:
        args.requests, args.train_steps = 10, 30
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as temporary:
        folder = pathlib.Path(args.work_dir or temporary)
        paths, source, sentences = prepare(args, folder)
        requests = make_requests(sentences, args.requests, args.per_request)
        engines = {}
        environ = {"TF_ENABLE_ONEDNN_OPTS": "0"} if args.no_onednn else {}
        runs = []  # (record name, engine, pools): CTranslate2 once per threading setting
        for engine in args.engines:
            if engine == "ctranslate2":
                runs += [(f"ctranslate2 {label(s)}", engine, s) for s in threading_grid()]
            else:
                runs.append((engine, engine, (args.intra_op_threads, args.inter_op_threads)))
        # The CTranslate2 engines' search, read here: their processes import no TensorFlow.
        search = signature_defaults(paths["saved_model"]) if paths.get("saved_model") and any(
            e.startswith("ctranslate2") for e in args.engines) else None
        for name, engine, pools in runs:  # a fresh process each: its own peak RSS
            context = multiprocessing.get_context("spawn")
            with context.Pool(1) as pool:
                engines[name] = pool.apply(load_engine, (
                    engine, paths, requests, thread_counts, pools,
                    environ if not engine.startswith("ctranslate2") else {},
                    search if engine.startswith("ctranslate2") else None))
    from keras_transformer.hardware import cpu_class, cpu_model

    record = {
        "benchmark": "serving_load", "engines": engines, "requests_per_thread_count":
        args.requests, "sentences_per_request": args.per_request, "thread_counts":
        thread_counts, "sentences_from": str(source), "exports": paths,
        "cpu_class": cpu_class(), "cpu": cpu_model(), "cores": os.cpu_count(),
        "load_average": [round(x, 1) for x in (*load_before, *os.getloadavg())],
        "ok": all(e["ok"] for e in engines.values())}
    record.update(ratios_vs_ctranslate2(engines))
    line = emit(record)
    if args.record:
        append_result("serving_load", line)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
