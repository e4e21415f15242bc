"""Errors shown to users as one clear line by the command line (no traceback)."""


class UserError(RuntimeError):
    """A run cannot go on; the message says why and what to do."""
