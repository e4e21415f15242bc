"""TensorFlow Serving's errors as its REST API answers them: `{"error": "..."}` with the HTTP
status of the error's code (its http_rest_api_handler's mapping), and the code's name."""

INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE = "INVALID_ARGUMENT", "NOT_FOUND", "UNAVAILABLE"
DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED = "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"
# Ours, beside TensorFlow Serving's: a body over the size limit, a body that stops arriving,
# a missing or unknown API key.
TOO_LARGE, BODY_TIMEOUT, UNAUTHENTICATED = "TOO_LARGE", "BODY_TIMEOUT", "UNAUTHENTICATED"

STATUS = {INVALID_ARGUMENT: 400, NOT_FOUND: 404, UNAVAILABLE: 503, DEADLINE_EXCEEDED: 504,
          RESOURCE_EXHAUSTED: 429, TOO_LARGE: 413, BODY_TIMEOUT: 408, UNAUTHENTICATED: 401}


class ServingError(Exception):
    """An answer other than a prediction: `code` (one of STATUS) and the message a client
    reads in `{"error": message}`."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code, self.message = code, message

    @property
    def status(self):
        return STATUS[self.code]

    @classmethod
    def invalid(cls, message):
        return cls(INVALID_ARGUMENT, message)

