"""The command's start-up without two optional imports that TensorFlow and Keras make on load.

When the packages are installed, `import tensorflow` imports JAX (tensorflow.lite's util looks
for `jax.jit`, to convert JAX functions to TFLite) and `import keras` imports matplotlib.pyplot
(for `keras.visualization`'s plots). Both imports sit in a `try ... except ImportError`, and the
command uses neither feature: it exports TFLite from TensorFlow functions, and its attention
pictures import matplotlib themselves. On 2 cores they took 1.3-2.1 s of a 6.4-8.5 s start
(docs/performance.md, "The command's start-up").

So, in the process of the installed `keras-transformer` command (whose entry point loads the
frameworks after parsing its arguments: keras_transformer_command.py), `without_optional_imports`
makes those imports fail as if the packages were missing while TensorFlow and Keras load, and
only then. Under the JAX backend Keras needs JAX, which is left alone. Anything that asks for
them afterwards (the attention pictures, a later `import jax`) imports them as usual; only
TFLite's JAX converter and Keras' plotting helpers stay off in that process.
"""

import contextlib
import importlib.abc
import os
import sys


class _NotWhileStarting(importlib.abc.MetaPathFinder):
    """Refuses the given top-level packages (and their modules) with ModuleNotFoundError."""

    def __init__(self, names):
        self.names = frozenset(names)

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(
                f"No module named {name!r} (not imported while the command starts)", name=name)
        return None


def optional_imports(backend=None):
    """The top-level packages the frameworks import on load only if they can: matplotlib, and
    jax unless Keras runs on JAX."""
    backend = backend or os.environ.get("KERAS_BACKEND", "tensorflow")
    return ("matplotlib",) if backend == "jax" else ("jax", "matplotlib")


@contextlib.contextmanager
def without_optional_imports(names=None):
    """Within the block, importing the packages `names` (default `optional_imports()`) or
    their modules raises ModuleNotFoundError; a package already imported is left alone."""
    names = [name for name in names or optional_imports() if name not in sys.modules]
    finder = _NotWhileStarting(names)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
