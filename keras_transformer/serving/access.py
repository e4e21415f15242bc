"""Optional API keys and a request rate per key (off unless `--api-keys FILE` is given).

A client sends its key as `Authorization: Bearer KEY` (or `X-API-Key: KEY`); a predict or
model request without a known key is refused, UNAUTHENTICATED (401), and one past its key's
rate, RESOURCE_EXHAUSTED (429), TensorFlow Serving's code for it. The rate is a token bucket
per key: `rate` requests a second on average, bursts of up to `rate` (at least one).
"""

import hmac
import threading
import time

from keras_transformer.errors import InputError
from keras_transformer.serving.errors import RESOURCE_EXHAUSTED, UNAUTHENTICATED, ServingError


def read_keys(path):
    """The keys of a file, one per line (blank lines and #-comments skipped)."""
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"--api-keys {path}: cannot read it ({error}).") from None
    keys = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    if not keys:
        raise InputError(f"--api-keys {path}: no key in it (one key per line).")
    return keys


class Access:
    """Which requests may pass: every one without keys; else those with a known key,
    within its rate (requests a second; None: no limit)."""

    def __init__(self, keys=(), rate=None):
        self.keys, self.rate = list(keys), rate
        self._buckets, self._lock = {}, threading.Lock()

    @property
    def on(self):
        return bool(self.keys)

    def check(self, headers):
        """Raises ServingError unless the request (its headers, a mapping) may pass."""
        if not self.keys:
            return
        given = headers.get("x-api-key") or ""
        authorization = headers.get("authorization") or ""
        if authorization.lower().startswith("bearer "):
            given = authorization[7:].strip()
        key = next((k for k in self.keys if hmac.compare_digest(k.encode(), given.encode())),
                   None)
        if key is None:
            raise ServingError(UNAUTHENTICATED, "a known API key is needed: send it as "
                               "'Authorization: Bearer KEY' or 'X-API-Key: KEY'.")
        if self.rate is not None and not self._take(key):
            raise ServingError(RESOURCE_EXHAUSTED, f"this API key is past its rate of "
                               f"{self.rate:g} requests a second (--rate-limit); try again "
                               "shortly.")

    def _take(self, key):
        now, burst = time.monotonic(), max(1.0, self.rate)
        with self._lock:
            tokens, last = self._buckets.get(key, (burst, now))
            tokens = min(burst, tokens + (now - last) * self.rate)
            if tokens < 1:
                self._buckets[key] = (tokens, now)
                return False
            self._buckets[key] = (tokens - 1, now)
            return True
