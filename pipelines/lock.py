"""One writer per folder: an exclusive lock on FOLDER/.lock, held by the operating system.

    with FolderLock(run_dir, "training"):         # a second writer gets FolderBusy at once
        ...
    with FolderLock(data_dir, "preparing", wait=True):   # a second writer waits its turn
        ...

The lock is `flock(2)` on the file: the kernel drops it when the process ends, however it ends
(SIGKILL, out of memory, a crash), so a killed writer leaves no stale lock and the next one
starts at once. The file itself stays; it holds who took the lock last (pid, host, since when,
what for), which the refusal quotes. Readers take no lock.

Locks nest within a process: a second `FolderLock` on a folder that this process holds already
is granted at once (the `train` command takes the run's lock before it imports TensorFlow, so
that a second writer is refused in a second, and the trainer takes it again). flock is
advisory and local to one machine on most network file systems (NFS gives each client its own
view of it on older kernels): two machines training into one run directory on a shared file
system are not stopped by it.
"""

import datetime
import fcntl
import json
import logging
import os
import pathlib
import socket

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"

# The lock files this process holds: real path -> [open file, FolderLocks holding it].
_HELD = {}


class FolderBusy(RuntimeError):
    """Another process holds the folder's lock; the message names it (pid, host, since when)."""

    def __init__(self, message, holder):
        super().__init__(message)
        self.holder = holder


def describe_holder(holder):
    """'pid 123 on host h since 2026-11-25 23:40:02 UTC (training)' from a lock file's record."""
    if not holder:
        return "another process (it has not written its name yet)"
    text = f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}"
    if holder.get("since"):
        text += f" since {holder['since']}"
    if holder.get("purpose"):
        text += f" ({holder['purpose']})"
    return text


class FolderLock:
    """An exclusive lock on `directory` (created if missing) for one writer.

    Args:
        directory: the folder to lock.
        purpose: what the holder does there ("training", "averaging"), recorded for others.
        wait: block until the holder is done (after a warning) instead of raising FolderBusy.
    """

    def __init__(self, directory, purpose, wait=False):
        self.directory = pathlib.Path(directory)
        self.path = self.directory / LOCK_FILE
        self.purpose, self.wait = purpose, wait
        self._key = None

    def holder(self):
        """The record the last holder wrote ({} when none or unreadable)."""
        try:
            return json.loads(self.path.read_text(encoding="utf-8") or "{}")
        except (OSError, ValueError):
            return {}

    def acquire(self):
        created = not self.directory.exists()
        self.directory.mkdir(parents=True, exist_ok=True)
        key = os.path.realpath(self.path)
        if key in _HELD:  # this process holds it already
            _HELD[key][1] += 1
            self._key = key
            return self
        # Opened without truncating: the holder's record stays readable until we hold the lock.
        file = open(self.path, "a+", encoding="utf-8")
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self.holder()
            if not self.wait:
                file.close()
                raise FolderBusy(f"{self.directory} is in use by {describe_holder(holder)}",
                                 holder) from None
            log.warning("%s is in use by %s; waiting for it", self.directory,
                        describe_holder(holder))
            fcntl.flock(file, fcntl.LOCK_EX)
        now = datetime.datetime.now(datetime.timezone.utc)
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "since": now.strftime("%Y-%m-%d %H:%M:%S UTC"), "purpose": self.purpose}
        # Written in place (not renamed: the lock is on this very file); readers of a record
        # being written see {} and say "another process".
        try:
            file.seek(0)
            file.truncate()
            file.write(json.dumps(record) + "\n")
            file.flush()
        except OSError:  # a full disk: the lock holds all the same, unnamed
            pass
        # A folder made here for nothing else (a command refused before writing) is removed
        # again on release, lock file included, so that a refusal leaves nothing behind.
        _HELD[key] = [file, 1, created and not self.wait]
        self._key = key
        return self

    def release(self):
        if self._key is None:
            return
        held = _HELD[self._key]
        held[1] -= 1
        if held[1] == 0:
            del _HELD[self._key]
            unused = held[2] and [p.name for p in self.directory.iterdir()] == [LOCK_FILE]
            if unused:
                self.path.unlink(missing_ok=True)
            fcntl.flock(held[0], fcntl.LOCK_UN)
            held[0].close()
            if unused:
                try:
                    self.directory.rmdir()
                except OSError:  # another process put something there meanwhile
                    pass
        self._key = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
