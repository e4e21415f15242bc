"""`serve`'s settings and the server: the run's engines behind the app (`app`), under uvicorn
(its C HTTP parser and event loop), and the drain on SIGTERM.

    settings = ServeSettings(run_dir="runs/multi30k-en-de")
    serve(settings)      # until SIGTERM: answers what it accepted, then returns 0

On SIGTERM the server stops accepting connections and says UNLOADING (readiness 503), answers
every request it has accepted (up to `drain_timeout_s`), ends its batch threads and returns;
the command then exits 0. SIGINT (Ctrl-C) does the same and the command exits 130.
"""

import dataclasses
import logging
import signal
import sys
import time
import typing

from keras_transformer.decoding.decoder import Decoder
from keras_transformer.decoding.engines.ctranslate2 import default_threading
from keras_transformer.decoding.request import TRANSLATE
from keras_transformer.defaults import export_name
from keras_transformer.errors import InputError
from keras_transformer.runs import open_run
from keras_transformer.serving import app as routes
from keras_transformer.serving.access import Access, read_keys
from keras_transformer.serving.batching import Batcher, BatchingParameters
from keras_transformer.serving.engines import CTRANSLATE2, KERAS, Engines
from keras_transformer.serving.metrics import Metrics
from keras_transformer.serving.parsing import Limits
from keras_transformer.serving.signatures import signatures

ENGINES = ("ctranslate2", "keras")  # --engine's names; the decoding request's: ENGINE_NAMES
ENGINE_NAMES = {"ctranslate2": CTRANSLATE2, "keras": KERAS}


@dataclasses.dataclass(frozen=True)
class ServeSettings:
    """What `serve` runs with (the command's flags; see `cli/serve.py` for each one's help)."""

    run_dir: str
    engine: typing.Optional[str] = None  # None: ctranslate2 where the run has its export
    host: str = "127.0.0.1"
    port: int = 8501  # TensorFlow Serving's REST port
    model_name: typing.Optional[str] = None  # None: the export's name (the run's)
    model_version: int = 1
    ctranslate2_model: typing.Optional[str] = None
    workers: typing.Optional[int] = None
    threads: typing.Optional[int] = None
    keras_fallback: bool = True
    max_batch_size: int = 32
    batch_timeout_micros: int = 0
    num_batch_threads: typing.Optional[int] = None  # None: CTranslate2's workers
    max_enqueued_batches: int = 32
    limits: Limits = Limits()
    max_body_bytes: int = 1 << 20
    rest_api_timeout_ms: int = 30000
    body_timeout_ms: int = 10000
    api_keys: typing.Optional[str] = None
    rate_limit: typing.Optional[float] = None
    access_log: bool = True
    drain_timeout_s: float = 8.0
    verbose: bool = False


def choose_engine(settings, run):
    """(engine name, why): the one asked for, else CTranslate2 where the run has its export
    (several times faster on a CPU), else Keras."""
    if settings.engine is not None:
        if settings.engine not in ENGINES:
            raise InputError(f"--engine {settings.engine}: choose {' or '.join(ENGINES)}.")
        return settings.engine, "--engine"
    given = Decoder(run=run).run_ctranslate2_export() if not settings.ctranslate2_model \
        else settings.ctranslate2_model
    if given is None:
        return "keras", ("the fastest available: the run has no CTranslate2 export "
                         "(keras-transformer export --format ctranslate2 makes one)")
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return "keras", "the fastest available: the ctranslate2 package is not installed"
    return "ctranslate2", f"the fastest available: the run's CTranslate2 export {given}"


def served_model(settings):
    """The `ServedModel` of `settings` (checked; its engines not loaded yet) and the line
    saying which engine serves and why."""
    run = open_run(settings.run_dir)
    engine, why = choose_engine(settings, run)
    languages = tuple(run.config.target_languages or ())
    given = {"engine": ENGINE_NAMES[engine]}
    given.update({name: getattr(settings, name) for name in (
        "ctranslate2_model", "workers", "threads") if getattr(settings, name) is not None})
    if languages:
        given["target_language"] = languages[0]
    decoder = Decoder.resolve(run, given, command=TRANSLATE)
    request = decoder.request
    workers = default_threading(request.workers, request.threads)[0]
    parameters = BatchingParameters(
        settings.max_batch_size, settings.batch_timeout_micros,
        settings.num_batch_threads or workers, settings.max_enqueued_batches)
    engines, metrics = Engines(decoder, settings.keras_fallback), Metrics()
    keys = read_keys(settings.api_keys) if settings.api_keys else ()
    served = routes.ServedModel(
        settings.model_name or export_name(run.directory), settings.model_version,
        signatures(request.beam_size, request.alpha, languages,
                   request.no_repeat_ngram_size, request.repetition_penalty), engines,
        Batcher(engines.run, parameters, metrics), metrics, Access(keys, settings.rate_limit),
        settings.limits, settings.max_body_bytes, settings.rest_api_timeout_ms / 1000,
        settings.body_timeout_ms / 1000)
    served.languages = languages
    return served, f"engine {engine} ({why})"


class DrainingServer:
    """uvicorn's Server, whose SIGTERM drains: readiness turns 503, the listening socket
    closes, accepted requests are answered, and `run` returns (the signal not raised
    again, so that the command exits 0)."""

    def __new__(cls, config, served):
        import uvicorn

        class Server(uvicorn.Server):
            def handle_exit(self, sig, frame):
                served.draining = True
                served.signalled = served.signalled or time.monotonic()
                if sig == signal.SIGTERM:
                    self.should_exit = True
                    return
                super().handle_exit(sig, frame)

        return Server(config)


def serve(settings, say=lambda line: print(line, file=sys.stderr, flush=True)):
    """Serves until SIGTERM (returns) or SIGINT (KeyboardInterrupt once drained); raises
    the engines' error if they fail to load."""
    import uvicorn

    served, engine_line = served_model(settings)
    _set_up_logging(settings)
    failure, began = [], time.monotonic()
    server = None

    def on_loaded(error):
        if error is not None:
            failure.append(error)
            server.should_exit = True
        else:
            say(f"{served.name} version {served.version} AVAILABLE after its warm-up "
                f"({time.monotonic() - began:.1f} s): {served.engines.describe()}")

    config = uvicorn.Config(
        routes.build_app(served, on_loaded), host=settings.host, port=settings.port,
        loop="uvloop", http="httptools", lifespan="on", access_log=False,
        log_level="info" if settings.verbose else "warning", server_header=False,
        timeout_graceful_shutdown=settings.drain_timeout_s)
    server = DrainingServer(config, served)
    say(f"serving {served.name} version {served.version} at http://{settings.host}:"
        f"{settings.port}/ (TensorFlow Serving's REST API: POST /v1/models/{served.name}"
        f":predict), {engine_line}; loading")
    server.run()
    if failure:
        raise failure[0]
    took = f" {time.monotonic() - served.signalled:.1f} s after the signal" \
        if served.signalled else ""
    say(f"{served.name}: drained and stopped{took}")
    return 0


def _set_up_logging(settings):
    log = routes.access_log
    log.setLevel(logging.INFO if settings.access_log else logging.WARNING)
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(handler)
        log.propagate = False
