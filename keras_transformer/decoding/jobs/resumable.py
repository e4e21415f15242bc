"""An output file written as a job goes, which a killed job run again continues.

    output = ResumableOutput("out.txt", identity={"input": file_identity("in.txt"), ...})
    skip the first output.done input lines
    for each window: output.write(input_lines=len(window), lines=translations)
    output.finish()           # out.txt appears, whole, in one rename

The lines go to `out.txt.partial` beside the output. After each window the record
`out.txt.partial.json` (written atomically) says what the job is (`identity`: the input file's
size, modification time and a hash of its first MiB, and the options that decide the output)
and how far it got: the input lines done and the bytes of `.partial` they filled, flushed and
synced to disk before the record says so. A run with the same identity cuts `.partial` back to
those bytes (a window killed half-written is dropped) and goes on after those input lines; a
run with another input or other options starts over, and says so. The output file itself is
only ever written whole (renamed at the end, as `pipelines.files.atomic_path` does). No
TensorFlow here.
"""

import hashlib
import json
import os
import pathlib

from pipelines.files import write_json

FORMAT = 1
HEAD_BYTES = 1 << 20  # the part of an input file hashed into its identity


def file_identity(path):
    """What tells a file apart from an edited or replaced one, cheaply: its resolved path,
    size, modification time (ns) and the SHA-256 of its first MiB."""
    path = pathlib.Path(path)
    stat = path.stat()
    with open(path, "rb") as handle:
        head = hashlib.sha256(handle.read(HEAD_BYTES)).hexdigest()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
            "head_sha256": head}


class ResumableOutput:
    """Output lines appended to `PATH.partial`, renamed to `PATH` by `finish()`.

    Args:
        path: the output file.
        identity: a JSON-able dict naming the job (input identities, options): a partial
            output is continued only by a job with an equal identity.

    Attributes:
        done: input lines already done (0 for a new job): the caller skips them.
        resumed: a one-line note when an earlier output was continued or set aside (None
            for a new job).
    """

    def __init__(self, path, identity):
        self.path = pathlib.Path(path)
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.record = self.path.with_name(self.path.name + ".partial.json")
        self.identity = json.loads(json.dumps({"format": FORMAT, **identity}))
        self.done, size, self.resumed = self._earlier()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(self.partial, "r+b" if size else "wb")
        self._handle.truncate(size)
        self._handle.seek(size)
        self._size = size

    def _earlier(self):
        """(input lines done, bytes of .partial they fill, note) of an earlier run's record."""
        if not self.record.exists():
            return 0, 0, None
        try:
            record = json.loads(self.record.read_text(encoding="utf-8"))
            lines, size = int(record["lines"]), int(record["bytes"])
            same = record["identity"] == self.identity
        except (OSError, ValueError, KeyError, TypeError):
            return 0, 0, f"{self.record} is unreadable: starting over"
        if not same:
            return 0, 0, (f"{self.partial} was written for another input or other options: "
                          "starting over")
        if not self.partial.exists() or self.partial.stat().st_size < size:
            return 0, 0, f"{self.partial} is missing or shorter than its record: starting over"
        return lines, size, (f"continuing {self.partial} after the {lines} input lines already "
                             "done")

    def write(self, input_lines, lines):
        """Appends the output `lines` of the next `input_lines` input lines, on disk before
        the record counts them."""
        data = "".join(line + "\n" for line in lines).encode("utf-8")
        self._handle.write(data)
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self.done += input_lines
        self._size += len(data)
        write_json(self.record, {"identity": self.identity, "lines": self.done,
                                 "bytes": self._size})

    def finish(self):
        """Renames the complete `.partial` to the output and removes the record."""
        self._handle.close()
        os.replace(self.partial, self.path)
        self.record.unlink(missing_ok=True)

    def close(self):
        """Closes the file and keeps `.partial` and its record for a later run (the job
        stopped early)."""
        if not self._handle.closed:
            self._handle.close()
