"""The project's error rule, in one place.

Errors a user can fix (bad input, a bad config, a missing or damaged file, a run that cannot
resume as asked) are `UserError`s: the message names the value, file or line and says what to
do, and never names a command-line flag (library code does not know how it was called). The
command line prints them as one line and exits with status 2. Anything else is an internal
error: status 1, with a traceback under `--debug`.

The subclasses that describe bad values are also `ValueError`s, so code written against the
library before this rule still catches them.
"""


class UserError(Exception):
    """Something the user can fix; the message says what and how."""


class ConfigError(UserError, ValueError):
    """A config key or value that cannot be used (unknown key, wrong type, out of range)."""


class InputError(UserError, ValueError):
    """Bad input data or arguments: a file that is missing or malformed, a bad option value."""


class RunError(UserError):
    """A run directory that cannot be used as asked: not a run, unfinished, or a different
    config than the one being resumed."""
