"""The pipelines' one error type: bad input data that the user can fix."""


class DataError(ValueError):
    """Bad input data; the message names the file, line or value and says what to do."""


class NoSpaceError(OSError):
    """A file could not be written for lack of space: the disk is full (ENOSPC), a quota is
    reached (EDQUOT) or the file-size limit (`ulimit -f`, EFBIG). The message names the file
    and says "no space left"; the writer left nothing partial behind."""
