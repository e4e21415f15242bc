"""The project's one way of writing a file or folder: `atomic_path` (write under a temporary
name beside the target, then rename), with `write_text`, `write_bytes`, `write_lines` and
`write_json` on top. A reader never sees a half-written file, and a killed writer (or one that
hit a full disk) leaves only a hidden `.tmp-PID-NAME`, which `remove_stale_temporaries` (called
by the next writer of that folder) deletes.

It lives on the lowest floor so that the input pipelines (prepared data shards) and the library
(run directories, exports) share it; `keras_transformer.runs.run` re-exports it.
"""

import contextlib
import json
import os
import pathlib
import shutil

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
        yield temporary
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
