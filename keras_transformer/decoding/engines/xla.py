"""Whether the Keras engine's search is compiled by XLA: the choice for `xla: auto`.

    on, reason = resolve_xla(None, "bfloat16")    # None: auto, from the table below
    resolve_xla(True)                             # (True, "--xla given")

XLA runs a search's whole loop as one program (no per-op dispatch, caches updated in place),
which pays on small models, but it compiles once per input shape (seconds each; the
translator pads batches to a few shapes, `search.compiling.bucket_rows`/`bucket_width`, and
the command keeps the compiled programs in a persistent cache, `cli.compilation_cache`), and
its CPU matrix products are not oneDNN's: on the bf16 classes oneDNN's bf16 kernels use the
CPU's bf16 units and XLA's do not beat them (docs/performance.md). So "auto" turns XLA on only
where the whole `translate` command was measured faster with it, on a warm cache, for that
CPU class and precision (`MEASURED`; `benchmarks/translate_command.py`), and leaves it off
everywhere else, unmeasured classes included. Under JAX every search is compiled (jax.jit):
"auto" says so.
"""

import keras

from keras_transformer.errors import InputError

# (CPU class, precision) -> (XLA on, what was measured): the whole `translate` command on
# Multi30k test2016 (the demo run, beam 4, batch 64), XLA with a warm persistent cache against
# the plain graph, `benchmarks/translate_command.py`, docs/performance.md "XLA for the whole
# command". Only a measured win turns XLA on.
MEASURED = {
    ("amx", "bfloat16"): (False, "XLA measured slower on the amx class in bfloat16 (the whole "
                                 "translate command 0.56x as fast, warm cache)"),
    ("amx", "float32"): (False, "XLA measured slower on the amx class in float32 (the whole "
                                "translate command 0.70x as fast, warm cache)"),
}


def resolve_xla(setting=None, precision="float32", flags=None, backend=None):
    """(XLA on, a one-line reason for people) for the `xla` setting: True, False, or None
    (auto: `MEASURED` for this CPU's class and `precision`). `flags`: the CPU's feature flags
    (default: this CPU's); `backend`: Keras' (default: the current one)."""
    from keras_transformer import hardware

    if setting is not None and not isinstance(setting, bool):
        raise InputError(f"xla={setting!r} must be True, False or None (auto).")
    if setting is not None:
        return setting, f"--{'' if setting else 'no-'}xla given"
    backend = backend or keras.backend.backend()
    if backend != "tensorflow":
        return True, f"auto: {backend} compiles every search with XLA"
    kind = hardware.cpu_class(flags)
    measured = MEASURED.get((kind, precision))
    if measured is None:
        return False, (f"auto: not measured faster on the {kind} class in {precision} "
                       "(--xla forces it)")
    on, what = measured
    return on, f"auto: {what}; --{'no-' if on else ''}xla overrides"
