"""Progress bars that read well wherever they go: tqdm's live bar on a terminal; one complete
line per refresh in a file or a pipe (`make demo > demo.log`), so that a log reads as the job's
history instead of one line of carriage returns.

No TensorFlow here: every floor (pipelines, training, the command) uses `progress_bar`.
"""

import sys

FILE_INTERVAL = 30.0  # seconds between lines when the output is not a terminal


class Lines:
    """A file for tqdm that is not a terminal: tqdm redraws its bar in place ("\\r" + text,
    padded with spaces); here each redraw becomes one line of its own (a repeat of the line
    before, as tqdm writes when it closes, is left out)."""

    def __init__(self, file):
        self.file, self.last = file, None

    def write(self, text):
        text = text.replace("\r", "").rstrip()
        if text and text != self.last:
            self.file.write(text + "\n")
            self.last = text

    def flush(self):
        getattr(self.file, "flush", lambda: None)()


def is_terminal(file):
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False


def progress_bar(iterable=None, file=None, interval=None, file_interval=FILE_INTERVAL,
                 **kwargs):
    """`tqdm(iterable, **kwargs)` writing to `file` (default sys.stderr): on a terminal a live
    bar refreshed every `interval` seconds (None: tqdm's default); elsewhere one line every
    `file_interval` seconds."""
    from tqdm import tqdm

    file = file or sys.stderr
    if is_terminal(file):
        if interval is not None:
            kwargs.update(mininterval=interval)
    else:
        file = Lines(file)
        # miniters=1: every update checks the clock itself, and tqdm's monitor thread (which
        # only steps in for bars with dynamic miniters) stays out: its extra redraws did not
        # reset the clock, so the next update wrote a second line within the same second.
        kwargs.update(mininterval=file_interval, maxinterval=max(file_interval, 1.0), miniters=1)
    return tqdm(iterable, file=file, **kwargs)
