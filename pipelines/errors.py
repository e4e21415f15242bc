"""The pipelines' one error type: bad input data that the user can fix."""


class DataError(ValueError):
    """Bad input data; the message names the file, line or value and says what to do."""
