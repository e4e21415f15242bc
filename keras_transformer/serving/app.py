"""The HTTP routes (a Starlette app): TensorFlow Serving's REST API for one model, the page
to try it, health and metrics.

    POST /v1/models/NAME[/versions/V]:predict   a prediction (`parsing`: row or columnar)
    GET  /v1/models/NAME[/versions/V]           version status: START, LOADING, AVAILABLE
                                                (after the warm-up), UNLOADING, END
    GET  /v1/models/NAME[/versions/V]/metadata  the signatures (`signatures.model_metadata`)
    GET  /                                      the page (`page`)
    GET  /healthz                               liveness: 200 while the process serves HTTP
    GET  /readyz                                readiness: 200 once AVAILABLE, 503 before,
                                                and from SIGTERM on
    GET  /metrics                               Prometheus' text format (`metrics`)

Every refusal is `{"error": "..."}` with TensorFlow Serving's status (`errors`); another
/v1/ path is 400 "Malformed request", as there. Each request writes one access log line.
"""

import asyncio
import contextlib
import json
import logging
import re
import time

from starlette.applications import Starlette
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from keras_transformer.serving import page
from keras_transformer.serving.errors import (
    BODY_TIMEOUT, DEADLINE_EXCEEDED, NOT_FOUND, TOO_LARGE, UNAVAILABLE, ServingError)
from keras_transformer.serving.parsing import answer, parse_body
from keras_transformer.serving.signatures import model_metadata

START, LOADING, AVAILABLE, UNLOADING, END = "START", "LOADING", "AVAILABLE", "UNLOADING", "END"
PREDICT = re.compile(r"/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?:predict")
MODEL = re.compile(r"/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?"
                   r"(?P<metadata>/metadata)?")
# A body past the limit is read (and dropped) up to this many bytes before the 413, so that
# a client writing it reads the answer instead of a reset connection; past it, the
# connection closes.
DRAINED_BYTES = 64 << 20

access_log = logging.getLogger("keras_transformer.serving.access")


class ServedModel:
    """The state one app serves: the model's name, version, signatures and engines, the
    batcher, limits and timeouts, its status, the metrics and the access rule."""

    def __init__(self, name, version, table, engines, batcher, metrics, access, limits,
                 max_body_bytes, timeout_s, body_timeout_s):
        self.name, self.version, self.table = name, str(version), table
        self.engines, self.batcher, self.metrics, self.access = engines, batcher, metrics, access
        self.limits, self.max_body_bytes = limits, max_body_bytes
        self.timeout_s, self.body_timeout_s = timeout_s, body_timeout_s
        self.state, self.error_message, self.draining = START, "", False
        self.languages = ()  # a run of several targets: its target languages
        self.signalled = None  # when SIGTERM (or SIGINT) came, time.monotonic()

    def load(self):
        """Loads and warms the engines (in a thread); AVAILABLE after, END with the error."""
        self.state = LOADING
        try:
            self.engines.load()
            self.engines.warm_up()
        except Exception as error:  # noqa: BLE001  (said in the status, then raised)
            self.state, self.error_message = END, f"{type(error).__name__}: {error}"
            raise
        self.state = AVAILABLE

    def check_model(self, name, version):
        if name != self.name:
            raise ServingError(NOT_FOUND, f"Servable not found for request: Latest({name})")
        if version is not None and version != self.version:
            raise ServingError(NOT_FOUND, f"Servable not found for request: "
                               f"Specific({name}, {version})")

    def status(self):
        code = "OK" if self.state != END or not self.error_message else "UNKNOWN"
        return {"model_version_status": [{"version": self.version, "state": self.state,
                                          "status": {"error_code": code,
                                                     "error_message": self.error_message}}]}


def error_response(error):
    return JSONResponse({"error": error.message}, status_code=error.status)


async def read_body(request, limit, timeout_s):
    """The request's body, TOO_LARGE past `limit` bytes, BODY_TIMEOUT when it has not all
    arrived within `timeout_s`."""
    declared = request.headers.get("content-length", "")
    chunks, size = [], 0

    async def receive():
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size <= limit:
                chunks.append(chunk)
            elif size > DRAINED_BYTES:
                break

    try:
        if not (declared.isdigit() and int(declared) > DRAINED_BYTES):
            await asyncio.wait_for(receive(), timeout_s)
    except TimeoutError:
        raise ServingError(BODY_TIMEOUT, f"the request's body did not arrive within "
                           f"{timeout_s * 1000:.0f} ms (--body-timeout-ms).") from None
    size = max(size, int(declared) if declared.isdigit() else 0)
    if size > limit:
        raise ServingError(TOO_LARGE, f"the request's body has {size} bytes: at most {limit} "
                           "(--max-body-bytes).")
    return b"".join(chunks)


async def predict(served, request, name, version):
    served.check_model(name, version)
    served.access.check(request.headers)
    if served.draining:
        raise ServingError(UNAVAILABLE, "the server is shutting down (SIGTERM): send the "
                           "request to another replica.")
    if served.state != AVAILABLE:
        raise ServingError(UNAVAILABLE, f"model {name} version {served.version} is "
                           f"{served.state}, not AVAILABLE yet.")
    body = await read_body(request, served.max_body_bytes, served.body_timeout_s)
    call = parse_body(body, served.table, served.limits)
    request.state.signature = call.signature.name
    served.metrics.request_lines.observe(call.lines)
    key = served.engines.batch_key(call)
    try:
        outputs = await asyncio.wait_for(served.batcher.submit(key, call), served.timeout_s)
    except TimeoutError:
        raise ServingError(DEADLINE_EXCEEDED, f"Deadline Exceeded: no answer within "
                           f"{served.timeout_s * 1000:.0f} ms (--rest-api-timeout-ms).") from None
    return Response(json.dumps(answer(call, outputs), ensure_ascii=False).encode("utf-8"),
                    media_type="application/json")


def v1_routes(served):
    """The handler of every /v1/ path."""
    async def v1(request):
        path, method = request.url.path, request.method
        found = PREDICT.fullmatch(path)
        if found and method == "POST":
            request.state.route = "predict"
            return await predict(served, request, found["name"], found["version"])
        found = MODEL.fullmatch(path)
        if found and method == "GET":
            served.check_model(found["name"], found["version"])
            served.access.check(request.headers)
            if found["metadata"]:
                request.state.route = "metadata"
                return JSONResponse(model_metadata(served.name, served.version, served.table))
            request.state.route = "status"
            return JSONResponse(served.status())
        raise ServingError.invalid(f"Malformed request: {method} {path}")

    return v1


def measured(served, handler, route):
    """`handler` answering ServingError in TensorFlow Serving's error shape, an internal
    error as 500, and writing the access log line and the metrics of each request."""
    async def endpoint(request):
        began = time.perf_counter()
        request.state.route, request.state.signature = route, None
        try:
            response = await handler(request)
        except ServingError as error:
            response = error_response(error)
        except Exception as error:  # noqa: BLE001  (one request's failure, not the server's)
            access_log.exception("internal error on %s", request.url.path)
            response = JSONResponse({"error": f"internal error: {type(error).__name__}: "
                                     f"{error}"}, status_code=500)
        seconds = time.perf_counter() - began
        served.metrics.observe(request.state.route, request.state.signature,
                               response.status_code, seconds)
        client = request.client.host if request.client else "-"
        access_log.info('%s "%s %s" %d %d %.1fms', client, request.method, request.url.path,
                        response.status_code, len(response.body), seconds * 1000)
        return response

    return endpoint


def build_app(served, on_loaded=None):
    """The Starlette app of `served`; its lifespan loads the engines in a thread (the
    port answers liveness meanwhile), calls `on_loaded(error or None)`, and at shutdown
    ends the batch threads."""
    async def healthz(request):
        return JSONResponse({"status": "alive"})

    async def readyz(request):
        ready = served.state == AVAILABLE and not served.draining
        return JSONResponse({"state": "UNLOADING" if served.draining else served.state},
                            status_code=200 if ready else 503)

    async def metrics(request):
        body, content_type = served.metrics.exposition()
        return Response(body, headers={"Content-Type": content_type})

    async def index(request):
        return HTMLResponse(page.for_model(served))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        loading = asyncio.get_running_loop().run_in_executor(None, _load, served, on_loaded)
        yield
        served.state = UNLOADING
        await loading
        served.batcher.close()
        served.state = END

    routes = [Route(path, measured(served, handler, route), methods=methods)
              for path, handler, route, methods in (
                  ("/", index, "page", ["GET"]), ("/healthz", healthz, "healthz", ["GET"]),
                  ("/readyz", readyz, "readyz", ["GET"]),
                  ("/metrics", metrics, "metrics", ["GET"]),
                  ("/v1/{rest:path}", v1_routes(served), "v1", ["GET", "POST"]))]
    return Starlette(routes=routes, lifespan=lifespan)


def _load(served, on_loaded):
    try:
        served.load()
    except Exception as error:  # noqa: BLE001  (the server stops and says it)
        if on_loaded is not None:
            on_loaded(error)
        return
    if on_loaded is not None:
        on_loaded(None)
