"""The persistent XLA compilation cache of the `keras-transformer` command.

XLA compiles a search once per input shape, seconds each: without a cache every command pays
that again. The command (never the package's `__init__`) points both compilers at one folder
per machine before either loads, through their environment variables:

* TensorFlow: `TF_XLA_FLAGS=--tf_xla_persistent_cache_directory=DIR` (read when TensorFlow
  first initializes XLA): a `jit_compile=True` function compiled by an earlier process is
  loaded from DIR instead of compiled.
* JAX: `JAX_COMPILATION_CACHE_DIR=DIR`, with `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0`
  and `JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=-1`, so that small programs (a tiny model's
  search compiles in well under JAX's default threshold of one second) are kept too.

The folder: `KERAS_TRANSFORMER_XLA_CACHE` if set (`off`, or empty, turns the cache off), else
`$XDG_CACHE_HOME/keras-transformer/xla`, else `~/.cache/keras-transformer/xla`; inside it one
subfolder per compiler version and CPU (class and a hash of its feature flags), because a
compiled CPU program holds the instructions of the CPU it was compiled for, and a home folder
may be shared by machines of several CPU classes. A setting the user made (TF_XLA_FLAGS
already naming a cache folder, JAX_COMPILATION_CACHE_DIR) is kept.
"""

import hashlib
import importlib.metadata
import os
import pathlib

from keras_transformer import hardware

ENV = "KERAS_TRANSFORMER_XLA_CACHE"
OFF = ("", "off", "0", "none")
TF_FLAG = "--tf_xla_persistent_cache_directory"


def base_folder(environ=None):
    """The cache's folder (None: turned off by KERAS_TRANSFORMER_XLA_CACHE)."""
    environ = os.environ if environ is None else environ
    if ENV in environ:
        value = environ[ENV].strip()
        return None if value.lower() in OFF else pathlib.Path(value).expanduser()
    root = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(root) / "keras-transformer" / "xla"


def cpu_tag(flags=None):
    """This CPU's class and a short hash of its feature flags, e.g. "amx-3f9a0c1d"."""
    flags = hardware.cpu_flags() if flags is None else flags
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:8]
    return f"{hardware.cpu_class(flags)}-{digest}"


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def folders(environ=None, flags=None):
    """{"tensorflow": DIR, "jax": DIR} of the cache (of the installed compilers; {} when the
    cache is off)."""
    base = base_folder(environ)
    if base is None:
        return {}
    found = {}
    for name in ("tensorflow", "jax"):
        version = _version(name)
        if version is not None:
            found[name] = base / f"{name}-{version}" / cpu_tag(flags)
    return found


def setup(environ=None, flags=None):
    """Points TensorFlow's and JAX's persistent compilation caches at `folders` in `environ`
    (os.environ), unless the user set them; call before TensorFlow or JAX loads. Returns
    {compiler: folder} of the caches set here, each folder made; one that cannot be made
    (a read-only home) leaves that compiler without a cache."""
    environ = os.environ if environ is None else environ
    chosen = {}
    for name, folder in folders(environ, flags).items():
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if name == "tensorflow":
            flags_now = environ.get("TF_XLA_FLAGS", "")
            if TF_FLAG in flags_now:
                continue
            environ["TF_XLA_FLAGS"] = f"{flags_now} {TF_FLAG}={folder}".strip()
        else:
            if "JAX_COMPILATION_CACHE_DIR" in environ:
                continue
            environ["JAX_COMPILATION_CACHE_DIR"] = str(folder)
            environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
            environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")
        chosen[name] = folder
    return chosen
