"""The project's one way of writing a file or folder: `atomic_path` (write under a temporary
name beside the target, then rename), with `write_text`, `write_bytes`, `write_lines` and
`write_json` on top. A reader never sees a half-written file, and a killed writer (or one that
hit a full disk) leaves only a hidden `.tmp-PID-NAME`, which `remove_stale_temporaries` (called
by the next writer of that folder) deletes. A write that fails for lack of space (a full disk,
a quota, the file-size limit) raises `NoSpaceError`, which names the file and says "no space
left", after removing its temporary: the previous file stays as it was.

It lives on the lowest floor so that the input pipelines (prepared data shards) and the library
(run directories, exports) share it; `keras_transformer.runs.run` re-exports it.
"""

import contextlib
import errno
import json
import os
import pathlib
import re
import shutil

from pipelines.errors import NoSpaceError

TEMPORARY_PREFIX = ".tmp-"


def temporary_path(path):
    """Where `atomic_path` writes `path` first: hidden, beside it, same suffix (Keras and
    matplotlib choose the format by the suffix), tagged with this process's id."""
    path = pathlib.Path(path)
    return path.with_name(f"{TEMPORARY_PREFIX}{os.getpid()}-{path.name}")


def _remove(path):
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)


def remove_stale_temporaries(directory):
    """Removes what writers that were killed left in `directory` (their process is gone)."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        return
    for path in directory.glob(TEMPORARY_PREFIX + "*"):
        pid = path.name[len(TEMPORARY_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and _alive(int(pid)):
            continue
        _remove(path)


def _alive(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_NO_SPACE_ERRNOS = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}
# How libraries that wrap the OS error in their own (HDF5, TensorFlow, zipfile) report it.
_NO_SPACE_TEXT = re.compile(r"No space left on device|File too large|Disk quota exceeded"
                            r"|errno = (?:%s)\b" % "|".join(map(str, sorted(_NO_SPACE_ERRNOS))))


def no_space(error):
    """Whether `error` (or an error it was raised from) says the disk is full or a file-size
    limit or quota was reached."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, OSError) and error.errno in _NO_SPACE_ERRNOS:
            return True
        if _NO_SPACE_TEXT.search(str(error)):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


def no_space_error(path, error, temporary=False):
    """The NoSpaceError to raise when writing `path` failed with `error` (`temporary`: a file
    in a temporary folder, which goes with it)."""
    path = pathlib.Path(path)
    kept = ("a temporary file, removed" if temporary
            else f"the previous {path.name} is kept" if path.exists() or path.is_symlink()
            else "nothing was written")
    reason = "file too large for the file-size limit" if "File too large" in str(error) or (
        isinstance(error, OSError) and error.errno == errno.EFBIG) else "disk full or quota"
    return NoSpaceError(f"no space left on the device writing {path} ({reason}); {kept}: free "
                        "some space (or raise the limit) and run the same command again")


@contextlib.contextmanager
def atomic_path(path, replace=True):
    """Yields a temporary path for a file or folder; renames it to `path` when the block ends
    without an error, removes it otherwise.

    Args:
        path: the file or folder to write. Its parent folder is created.
        replace: an existing `path` is replaced (a folder is moved aside first, then deleted);
            False raises FileExistsError instead.
    """
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_path(path)
    _remove(temporary)
    try:
        try:
            yield temporary
        except NoSpaceError:
            raise  # a write inside named its file already
        except Exception as error:
            if no_space(error):
                raise no_space_error(path, error) from None
            raise
        if path.exists() and not replace:
            raise FileExistsError(f"{path} already exists.")
        if path.is_dir() and not path.is_symlink():
            old = path.with_name(f"{TEMPORARY_PREFIX}{os.getpid()}-old-{path.name}")
            os.replace(path, old)
            os.replace(temporary, path)
            _remove(old)
        else:
            os.replace(temporary, path)
    finally:
        _remove(temporary)


def write_bytes(path, data):
    with atomic_path(path) as temporary:
        temporary.write_bytes(data)
    return pathlib.Path(path)


def write_text(path, text):
    with atomic_path(path) as temporary:
        temporary.write_text(text, encoding="utf-8")
    return pathlib.Path(path)


def write_lines(path, lines):
    return write_text(path, "".join(line + "\n" for line in lines))


def write_json(path, data):
    return write_text(path, json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
