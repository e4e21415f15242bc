"""Progress in a log file or a pipe is one complete line per refresh, never carriage returns."""

import io
import subprocess
import sys

from keras_transformer.training.callbacks import Progress
from pipelines.progress import progress_bar


def test_training_progress_in_a_log_file_is_one_line_per_refresh():
    step = {"n": 0}
    log_file = io.StringIO()  # not a terminal: a file or a pipe
    progress = Progress(lambda: step["n"], total_steps=5, interval=0.0, file=log_file)
    progress.on_train_begin()
    for _ in range(5):
        step["n"] += 1
        progress.on_train_batch_end(0, {"loss": 2.5})
    progress.on_train_end()
    text = log_file.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and len(lines) >= 5, text
    assert all(line.startswith("training: step ") for line in lines), text
    assert lines[-1].startswith("training: step 5/5 (100%)"), text
    assert len(set(lines)) == len(lines), text  # closing does not repeat the last line


def test_any_bar_sent_to_a_pipe_writes_lines():
    code = ("from pipelines.progress import progress_bar\n"
            "for _ in progress_bar(range(3), desc='decoding', file_interval=0.0): pass\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines and all(line.startswith("decoding: ") for line in lines), result.stderr
    assert "3/3" in lines[-1], result.stderr


def test_a_terminal_keeps_the_live_bar():
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    out = Terminal()
    for _ in progress_bar(range(3), file=out, interval=0.0):
        pass
    assert "\r" in out.getvalue()


def test_lines_in_a_log_are_one_refresh_interval_apart():
    # tqdm's monitor thread (here every 50 ms instead of 10 s, so the test is short) used to
    # redraw a slowed-down bar without resetting its clock: the next update then wrote a second
    # line within the same second.
    code = """
import time
import tqdm
from pipelines.progress import progress_bar

tqdm.tqdm.monitor_interval = 0.05
stamps = []

class Log:
    def write(self, text):
        stamps.append(time.monotonic())

bar = progress_bar(total=100, file=Log(), file_interval=0.4)
for i in range(40):
    time.sleep(0.005 if i < 10 else 0.1)  # fast, then slow: the monitor's case
    bar.update(1)
bar.close()
gaps = [b - a for a, b in zip(stamps[1:-2], stamps[2:-1])]  # not the first or closing line
print(len(stamps), min(gaps))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    count, smallest_gap = result.stdout.split()
    assert int(count) >= 5 and float(smallest_gap) >= 0.35, result.stdout
