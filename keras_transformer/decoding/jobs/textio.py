"""Text lines in and out of the commands: the UTF-8 line policy.

Evaluation inputs must be valid UTF-8 as a whole (`read_lines` refuses a file before anything
is decoded or written); translation and parsing inputs are decoded line by line (`BadLines`):
a line that is not UTF-8 is named on standard error, its output line is left empty (one output
line per input line), and the command fails at the end naming the first and counting
them. Output files are written atomically (`write_lines`); `streaming` reads inputs of any
size a window at a time. No TensorFlow here.
"""

import contextlib
import os
import stat
import sys

from keras_transformer.errors import InputError
from pipelines.files import write_lines  # noqa: F401  (re-exported: the one line writer)


def decode_line(raw, number, offset, name):
    """(text, None) for a valid UTF-8 line, else (None, a message naming line and bytes)."""
    try:
        return raw.decode("utf-8").rstrip("\r\n"), None
    except UnicodeDecodeError as error:
        return None, (f"{name}, line {number}: invalid UTF-8 ({error.reason}) at byte "
                      f"{error.start} of the line, byte {offset + error.start} of the input")


def raw_lines(path):
    """(line number, byte offset, bytes) of a file's lines, or of standard input's (path
    None)."""
    try:
        handle = open(path, "rb") if path else sys.stdin.buffer
    except FileNotFoundError:
        raise InputError(f"Input file not found: {path}") from None
    offset = 0
    with handle if path else contextlib.nullcontext(handle):
        for number, raw in enumerate(handle, 1):
            yield number, offset, raw
            offset += len(raw)


def stdin_is_a_file():
    """Whether standard input is a regular file (`< input.txt`) rather than a pipe, a terminal
    or a stand-in without a descriptor: nothing waits on a file's lines, so it can be read as
    `--input` is, in whole windows."""
    try:
        return stat.S_ISREG(os.fstat(sys.stdin.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):  # no descriptor, a closed or fake stdin
        return False


def count_lines(path):
    """The lines of a file, counted in one cheap pass over its bytes (a last line without a
    newline counts): the total of a progress bar, the check that two files align."""
    count, last = 0, b"\n"
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                count += chunk.count(b"\n")
                last = chunk[-1:]
    except FileNotFoundError:
        raise InputError(f"Input file not found: {path}") from None
    return count + (last != b"\n")


def checked_lines(path):
    """The lines of a file that must be valid UTF-8 (evaluation inputs), one at a time:
    InputError naming the first bad line and its byte offsets. Count them first
    (`sum(1 for _ in checked_lines(path))`) to refuse a bad file before anything is
    decoded or written."""
    for number, offset, raw in raw_lines(path):
        text, problem = decode_line(raw, number, offset, path)
        if problem:
            raise InputError(f"{problem}. Nothing was translated; convert the file to UTF-8 "
                             "(e.g. iconv -f latin1 -t utf-8).")
        yield text


def read_lines(path):
    """All lines of a file that must be valid UTF-8 (`checked_lines`), in a list."""
    return list(checked_lines(path))


def windows(items, size):
    """Lists of up to `size` consecutive items of an iterable, read as they are needed."""
    window = []
    for item in items:
        window.append(item)
        if len(window) >= size:
            yield window
            window = []
    if window:
        yield window


class BadLines:
    """Input lines that are not valid UTF-8 (translate, parse): each is named on standard error
    when met and left empty in the output, which keeps one output line per input line; at the
    end `check()` fails the command (exit status 2) naming them all.

        bad = BadLines(path or "standard input")
        texts = [bad.decode(*line) for line in raw_lines(path)]   # None where not UTF-8
        outputs = run_on(translate, texts, empty="")
        bad.check()
    """

    def __init__(self, name):
        self.name, self.first, self.count = name, None, 0  # bounded, whatever the input

    def decode(self, number, offset, raw, quiet=False):
        """The line's text, or None (named on standard error unless `quiet`: a line an earlier
        run already named, and counted for `check()`)."""
        text, problem = decode_line(raw, number, offset, self.name)
        if problem:
            self.first, self.count = self.first or problem, self.count + 1
            if not quiet:
                    print(f"keras-transformer: warning: {problem}; its output line is left empty",
                      file=sys.stderr, flush=True)
        return text

    def check(self):
        if self.count:
            more = f" (and {self.count - 1} more)" if self.count > 1 else ""
            raise InputError(f"{self.count} input line(s) were not valid UTF-8 and were "
                             f"left empty in the output: {self.first}{more}.")


def run_on(function, texts, empty):
    """`function` on the decoded texts; `empty` where a line could not be decoded (None)."""
    done = iter(function([text for text in texts if text is not None]))
    return [empty if text is None else next(done) for text in texts]
