"""`keras-transformer serve`: a run's translations over HTTP, speaking TensorFlow Serving's
REST API (`POST /v1/models/NAME:predict`, `GET /v1/models/NAME[/metadata]`), on CTranslate2's
workers (or the Keras engine), an ASGI app (Starlette) under uvicorn.

    errors.py      ServingError: TensorFlow Serving's error codes and their HTTP statuses
    signatures.py  the SavedModel's text signatures as the server answers them: inputs,
                   defaults, outputs, the metadata
    parsing.py     a predict request's JSON (row or columnar) -> a checked `Call`; answers
    engines.py     the engines a server holds (the CTranslate2 one, the Keras one), the
                   searches of a batch of calls, the warm-up
    batching.py    concurrent calls searched together: TensorFlow Serving's knobs, a bounded
                   queue
    metrics.py     Prometheus metrics (requests, errors, latency, batch sizes, queue depth)
    access.py      API keys and their request rate
    page.py        the page at `/` to try the model
    app.py         the routes (Starlette), the error shape, the access log
    server.py      the settings, uvicorn, the drain on SIGTERM

Nothing here imports TensorFlow unless the Keras engine is asked for.
"""
