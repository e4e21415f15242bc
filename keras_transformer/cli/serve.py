"""`serve`: a run's translations over HTTP, speaking TensorFlow Serving's REST API
(`keras_transformer.serving`).

    keras-transformer serve --run-dir runs/multi30k-en-de
    curl -d '{"instances": [{"sentences": "A dog runs."}]}' \\
        localhost:8501/v1/models/multi30k-en-de:predict
"""

import sys

from keras_transformer.cli.flags import add_run_flags


def serve(args):
    from keras_transformer.serving.parsing import Limits
    from keras_transformer.serving.server import ServeSettings, serve as run_server

    settings = ServeSettings(
        run_dir=args.run_dir, engine=args.engine, host=args.host, port=args.port,
        model_name=args.model_name, model_version=args.model_version,
        ctranslate2_model=args.ctranslate2_model, workers=args.workers, threads=args.threads,
        keras_fallback=not args.no_keras_fallback, max_batch_size=args.max_batch_size,
        batch_timeout_micros=args.batch_timeout_micros,
        num_batch_threads=args.num_batch_threads,
        max_enqueued_batches=args.max_enqueued_batches,
        limits=Limits(max_lines=args.max_lines, max_words=args.max_words),
        max_body_bytes=args.max_body_bytes, rest_api_timeout_ms=args.rest_api_timeout_ms,
        body_timeout_ms=args.body_timeout_ms, api_keys=args.api_keys,
        rate_limit=args.rate_limit, access_log=not args.no_access_log,
        drain_timeout_s=args.drain_timeout_s, verbose=args.verbose)
    run_server(settings)
    # Drained: every accepted request answered, nothing left to write. The interpreter's
    # teardown with TensorFlow loaded (the Keras engine) takes seconds (2.4 s measured for
    # `import tensorflow` alone on 2 busy cores), which would count against the grace
    # period of the SIGTERM that stopped the server: the process ends here, status 0.
    import logging
    import os

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def positive(kind):
    def parse(text):
        value = kind(text)
        if value <= 0:
            raise ValueError(text)
        return value

    parse.__name__ = kind.__name__
    return parse


def register(commands):
    parser = commands.add_parser(
        "serve",
        help="serve a run's translations over HTTP (TensorFlow Serving's REST API)",
        description="Serves a trained run over HTTP with TensorFlow Serving's REST API: "
        "POST /v1/models/NAME[/versions/V]:predict with the signatures of the run's SavedModel "
        "(serving_default, translate_nbest, sample, score; row 'instances' or columnar "
        "'inputs'), GET /v1/models/NAME (version status, AVAILABLE after the warm-up) and "
        "GET /v1/models/NAME/metadata. Concurrent requests are batched, sorted by length, on "
        "CTranslate2's workers; a full queue answers 503 at once. Also: a page to try it at /, "
        "/healthz (liveness), /readyz (readiness), /metrics (Prometheus). SIGTERM stops "
        "accepting connections, answers what was accepted and exits 0.",
        epilog="docs/serving.md compares it with TensorFlow Serving running the SavedModel.")
    add_run_flags(parser)
    add_engine_flags(parser.add_argument_group("engine"))
    add_http_flags(parser.add_argument_group("HTTP"))
    add_batching_flags(parser.add_argument_group(
        "batching", "TensorFlow Serving's batching parameters, by its names"))
    add_limit_flags(parser.add_argument_group("limits and timeouts"))
    add_access_flags(parser.add_argument_group("access"))
    # The Keras classes are registered by the server where it loads the Keras engine
    # (`serving.engines`): a CTranslate2 server without it loads no TensorFlow.
    parser.set_defaults(run=serve, registers_keras=True)


def add_engine_flags(engine):
    engine.add_argument("--engine", choices=("ctranslate2", "keras"),
                        help="ctranslate2: the run's CTranslate2 export; keras: the run's "
                        "model, float32, the SavedModel's search (default: ctranslate2 where "
                        "the run has its export, else keras; said on start)")
    engine.add_argument("--ctranslate2-model", metavar="FOLDER",
                        help="CTranslate2 export folder (default: saved_models/RUN_NAME/"
                        "ctranslate2-int8, else .../ctranslate2)")
    engine.add_argument("--workers", type=positive(int), metavar="N",
                        help="ctranslate2: searches run at once (its inter_threads; default "
                        "one per core, the fastest setting measured)")
    engine.add_argument("--threads", type=positive(int), metavar="N",
                        help="ctranslate2: threads of each worker (intra_threads; default 1)")
    engine.add_argument("--no-keras-fallback", action="store_true",
                        help="ctranslate2: hold no Keras engine (no TensorFlow in the "
                        "process); requests with constraints, which CTranslate2 cannot "
                        "search, are then refused (default: searched by the Keras engine)")


def add_http_flags(http):
    http.add_argument("--host", default="127.0.0.1",
                      help="address to listen on (127.0.0.1; 0.0.0.0: every interface)")
    http.add_argument("--port", type=int, default=8501,
                      help="port (8501, TensorFlow Serving's REST port)")
    http.add_argument("--model-name", help="the NAME in /v1/models/NAME (default: the "
                      "export's name, the run directory's)")
    http.add_argument("--model-version", type=positive(int), default=1,
                      help="the version answered and accepted in /versions/V (1)")


def add_batching_flags(batching):
    batching.add_argument("--max-batch-size", type=positive(int), default=32, metavar="LINES",
                          help="the most sentences searched in one batch (32); a larger "
                          "request is a batch of its own")
    batching.add_argument("--batch-timeout-micros", type=int, default=0, metavar="US",
                          help="how long a free batch thread waits for its batch to fill "
                          "(0: it starts at once; requests arriving while the threads are "
                          "busy fill the next batch anyway)")
    batching.add_argument("--num-batch-threads", type=positive(int), metavar="N",
                          help="batches searched at once (default: CTranslate2's workers)")
    batching.add_argument("--max-enqueued-batches", type=positive(int), default=32,
                          metavar="N", help="the queue's bound, in batches of "
                          "--max-batch-size sentences (32); a request past it is answered "
                          "503 at once")


def add_limit_flags(limits):
    limits.add_argument("--max-body-bytes", type=positive(int), default=1 << 20, metavar="N",
                        help="the largest request body (1 MiB); larger: 413")
    limits.add_argument("--max-lines", type=positive(int), default=1024, metavar="N",
                        help="the most sentences in one request (1024); more: 413")
    limits.add_argument("--max-words", type=positive(int), default=65536, metavar="N",
                        help="the most whitespace-separated words over one request's texts "
                        "(65536); more: 413")
    limits.add_argument("--rest-api-timeout-ms", type=positive(int), default=30000,
                        metavar="MS", help="a request not answered within this is answered "
                        "504 (30000, as TensorFlow Serving's --rest_api_timeout_in_ms)")
    limits.add_argument("--body-timeout-ms", type=positive(int), default=10000, metavar="MS",
                        help="a body not received within this is answered 408 (10000)")
    limits.add_argument("--drain-timeout-s", type=positive(float), default=8.0, metavar="S",
                        help="on SIGTERM, how long accepted requests may take to be answered "
                        "before their connections are closed (8)")


def add_access_flags(access):
    access.add_argument("--api-keys", metavar="FILE",
                        help="require an API key, one of this file's lines, as "
                        "'Authorization: Bearer KEY' or 'X-API-Key' (default: none needed)")
    access.add_argument("--rate-limit", type=positive(float), metavar="PER_S",
                        help="with --api-keys: requests a second per key; past it, 429")
    access.add_argument("--no-access-log", action="store_true",
                        help="no access log line per request on standard error")
