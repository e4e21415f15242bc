"""The one-writer lock (pipelines/lock.py) with real processes: a second writer is refused naming
the holder, a waiting one gets it when the holder ends, a SIGKILLed holder leaves no lock."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from keras_transformer.errors import RunError
from keras_transformer.runs import Run
from pipelines.lock import FolderBusy, FolderLock

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def hold(directory, purpose="training"):
    """A process that takes the folder's lock and keeps it until killed."""
    process = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pipelines.lock import FolderLock; "
         f"lock = FolderLock({str(directory)!r}, {purpose!r}).acquire(); "
         "print('held', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_second_writer_is_refused_naming_the_holder_until_it_is_killed(tmp_path):
    holder = hold(tmp_path)
    try:
        with pytest.raises(FolderBusy) as busy:
            FolderLock(tmp_path, "averaging").acquire()
        assert str(busy.value).startswith(
            f"{tmp_path} is in use by pid {holder.pid} on host {socket.gethostname()} since ")
        assert str(busy.value).endswith(" UTC (training)")
        # The run's lock says what to do, in one line.
        with pytest.raises(RunError, match=rf"^cannot start exporting: {tmp_path} is in use by "
                                           rf"pid {holder.pid} .*wait for that process to end "
                                           "or stop it$"):
            with Run(tmp_path).lock("exporting"):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The kernel dropped the lock with the process: the next writer gets it at once.
    with FolderLock(tmp_path, "training") as lock:
        assert json.loads(lock.path.read_text())["pid"] == os.getpid()
    with Run(tmp_path).lock("averaging"):
        pass


def test_a_waiting_writer_gets_the_lock_when_the_holder_ends(tmp_path):
    holder = hold(tmp_path, "preparing")
    killed = threading.Event()

    def kill():
        killed.set()
        holder.send_signal(signal.SIGKILL)

    threading.Timer(0.5, kill).start()
    with FolderLock(tmp_path, "preparing", wait=True):  # `prepare` waits for the other one
        # It waited: the lock came only once the holder was killed, and died of it.
        assert killed.is_set()
        assert holder.wait(timeout=10) == -signal.SIGKILL


def test_a_run_lock_needs_the_run_directory(tmp_path):
    with pytest.raises(RunError, match="not found: is it a training run directory"):
        with Run(tmp_path / "missing").lock("averaging"):
            pass
    assert not (tmp_path / "missing").exists()


def test_locks_nest_within_a_process(tmp_path):
    with FolderLock(tmp_path, "training"):
        with FolderLock(tmp_path, "training"):  # the command, then the trainer
            pass
        holder = subprocess.Popen(  # still held after the inner one is released
            [sys.executable, "-c", "from pipelines.lock import FolderLock; "
             f"FolderLock({str(tmp_path)!r}, 'x').acquire()"], cwd=ROOT,
            stderr=subprocess.PIPE, text=True)
        assert holder.wait() == 1 and "FolderBusy" in holder.stderr.read()
    with FolderLock(tmp_path, "averaging") as lock:  # released: a new lock is taken
        assert json.loads(lock.path.read_text())["purpose"] == "averaging"
