"""Helpers for training tests: a tiny parallel corpus the tests write, the train command, and
the subprocesses the tests start, wait for and kill."""

import os
import random
import signal
import subprocess
import sys
import time

WORDS = ["dog", "cat", "bird", "runs", "jumps", "sleeps", "the", "a", "red", "big", "small",
         "green", "in", "on", "park", "house", "tree", "water"]


def reversed_upper(sentence):
    return " ".join(reversed(sentence.upper().split()))


def write_corpus(folder, pairs=400, seed=0, target=reversed_upper, words=WORDS):
    """A toy 'translation' corpus: sources of 2-9 `words`, the target `target(source)`, by
    default the source reversed, in upper case. The last 40 pairs are the dev set."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    src = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) for _ in range(pairs)]
    tgt = [target(s) for s in src]
    paths = {}
    for name, lines in (("train.src", src[:-40]), ("train.tgt", tgt[:-40]),
                        ("dev.src", src[-40:]), ("dev.tgt", tgt[-40:])):
        paths[name] = folder / name
        paths[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


def train_command(corpus, output_dir, *extra):
    return [
        sys.executable, "-m", "keras_transformer.cli", "train", "--preset", "tiny",
        "--dataset", "text", "--train-src", str(corpus["train.src"]),
        "--train-tgt", str(corpus["train.tgt"]), "--dev-src", str(corpus["dev.src"]),
        "--dev-tgt", str(corpus["dev.tgt"]), "--vocab-size", "400", "--tokens-per-batch", "256",
        "--max-length", "32", "--warmup-steps", "50", "--output-dir", str(output_dir),
        "--verbose", "0", "--precision", "float32", "--no-tune",  # (tests/test_tune.py tunes)
        *extra,  # *extra may ask for another precision
    ]


def run(command, **kwargs):
    return subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)


def run_python(*args, timeout=900, **kwargs):
    """`python *args` in a fresh interpreter (this one's), TensorFlow's C++ logs quiet."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, env=env, **kwargs)


def wait_for(condition, process, seconds=300):
    """Until condition() holds; fails if `process` ends first or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert process.poll() is None, f"exited with {process.returncode} before it should"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def kill_once_exists(command, path, cwd=None, seconds=300):
    """Starts `command`, SIGKILLs it as soon as `path` exists (or once it ended, or after
    `seconds`), and returns its standard error. The caller checks that `path` exists."""
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               cwd=cwd)
    try:
        deadline = time.monotonic() + seconds
        while not path.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        process.send_signal(signal.SIGKILL)
        error = process.communicate()[1].decode(errors="replace")
    return error
