"""The CPU this process runs on, and the TensorFlow kernel settings the command picks for it.

Imports nothing heavy: the command calls `apply_cpu_defaults` before TensorFlow is imported,
because TensorFlow reads `TF_ENABLE_ONEDNN_OPTS` when it loads.

CPU classes (what decides TensorFlow's speed here, see README "Kernels per CPU class"):

    amx          Intel Sapphire Rapids and later: AMX tiles (bf16 matrix units)
    avx512_bf16  AMD Zen 4 and later, Intel Cooper Lake: AVX-512 with bf16 dot products
    avx512       AVX-512 without bf16
    avx2         AVX2 only (e.g. AMD Zen 2/3 EPYC)
    other        none of these (or not Linux)

TensorFlow turns its oneDNN kernels on by default only on AVX-512 CPUs; on the AVX2 class the
command turns them on as well (measured faster for training there: ONEDNN_DEFAULT_ON).

The bf16 classes (amx, avx512_bf16) have bf16 dot products in hardware: there training under
Keras' mixed_bfloat16 policy is faster than float32, elsewhere it is several times slower
(docs/performance.md). `choose_precision` makes that choice for `precision: auto`.
"""

import os

# Classes on which the command sets TF_ENABLE_ONEDNN_OPTS=1 unless the environment says
# otherwise. TensorFlow already does so on the AVX-512 classes.
ONEDNN_DEFAULT_ON = ("avx2",)


def _cpuinfo(field, path="/proc/cpuinfo"):
    """The first CPU's value of `field` in /proc/cpuinfo (None where it is missing)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_flags():
    """The first CPU's feature flags (an empty set where /proc/cpuinfo is missing)."""
    return set((_cpuinfo("flags") or "").split())


def cpu_model():
    return _cpuinfo("model name") or "unknown"


def cpu_class(flags=None):
    """One of "amx", "avx512_bf16", "avx512", "avx2", "other" (see the module's docstring)."""
    flags = cpu_flags() if flags is None else flags
    if "amx_bf16" in flags or "amx_tile" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    if "avx512f" in flags:
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    return "other"


# Classes whose CPUs compute bf16 dot products in hardware.
BF16_CLASSES = ("amx", "avx512_bf16")


def has_bf16(flags=None):
    """Whether this CPU (or one with `flags`) has bf16 dot products in hardware."""
    return cpu_class(flags) in BF16_CLASSES


def choose_precision(flags=None, backend="tensorflow", accelerator=None):
    """The Keras dtype policy for training where the config says `precision: auto`.

    Args:
        flags: the CPU's feature flags (default: this CPU's).
        backend: Keras' backend.
        accelerator: (platform, has_bf16) of the device JAX trains on, or None for a CPU.

    Returns:
        (policy, reason): mixed_bfloat16 on a GPU with bf16 under JAX and on the bf16 CPU
        classes under TensorFlow (oneDNN's bf16 kernels), float32 elsewhere.
    """
    if accelerator is not None and accelerator[0] != "cpu":
        platform, bf16 = accelerator
        if bf16:
            return "mixed_bfloat16", f"this {platform.upper()} computes in bf16"
        return "float32", f"this {platform.upper()} has no bf16"
    kind = cpu_class(flags)
    if backend != "tensorflow":
        return "float32", f"{backend} on a CPU (bf16 kernels are TensorFlow's oneDNN ones)"
    if kind in BF16_CLASSES:
        return "mixed_bfloat16", f"this CPU has bf16 dot products ({kind} class)"
    return "float32", f"{kind} class: no bf16 in this CPU (mixed_bfloat16 would be slower)"


def jax_accelerator():
    """(platform, has_bf16) of JAX's first device; imports JAX (call it under JAX only)."""
    import jax

    device = jax.devices()[0]
    if device.platform == "cpu":
        return ("cpu", False)
    capability = getattr(device, "compute_capability", None)  # CUDA: "8.0" and up has bf16
    bf16 = capability is None or float(capability) >= 8.0
    return (device.platform, bf16)


def describe_cpu():
    """{"cpu": model name, "cpu_class": class, "cores": usable cores} for results and logs."""
    return {"cpu": cpu_model(), "cpu_class": cpu_class(), "cores": len(os.sched_getaffinity(0))
            if hasattr(os, "sched_getaffinity") else os.cpu_count()}


# What apply_cpu_defaults decided, for the effective config: {"TF_ENABLE_ONEDNN_OPTS": (value,
# reason)}.
CHOICES = {}


def apply_cpu_defaults(environ=None, flags=None):
    """Sets the command's kernel defaults for this CPU class in `environ` (os.environ) unless
    the user has set them, and records them in CHOICES. Must run before TensorFlow loads."""
    environ = os.environ if environ is None else environ
    kind = cpu_class(flags)
    if "TF_ENABLE_ONEDNN_OPTS" not in environ and kind in ONEDNN_DEFAULT_ON:
        environ["TF_ENABLE_ONEDNN_OPTS"] = "1"
        CHOICES["TF_ENABLE_ONEDNN_OPTS"] = ("1", f"the default on the {kind} class (faster "
                                                 "there; TF_ENABLE_ONEDNN_OPTS=0 turns it off)")
    else:
        CHOICES["TF_ENABLE_ONEDNN_OPTS"] = _onednn_unchosen(environ, kind)
    return dict(CHOICES)


def _onednn_unchosen(environ, kind):
    """(value, reason) of TF_ENABLE_ONEDNN_OPTS where the command did not set it."""
    if "TF_ENABLE_ONEDNN_OPTS" in environ:
        return environ["TF_ENABLE_ONEDNN_OPTS"], "set by the user"
    return "TensorFlow's default", (f"{kind} class: oneDNN is "
                                    + ("on" if _tensorflow_onednn_default(kind) else "off"))


def _tensorflow_onednn_default(kind):
    """Whether TensorFlow runs its oneDNN kernels on a CPU of class `kind` when the
    environment does not say: on the AVX-512 classes."""
    return kind.startswith(("avx512", "amx"))


def onednn_on(environ=None, flags=None):
    """Whether TensorFlow, loaded with `environ` (os.environ), runs its oneDNN kernels on this
    CPU: as TF_ENABLE_ONEDNN_OPTS says where it is set ("0" or "false": off), else
    TensorFlow's default for the CPU's class."""
    environ = os.environ if environ is None else environ
    value = environ.get("TF_ENABLE_ONEDNN_OPTS")
    if value is not None:
        return value.strip().lower() not in ("0", "false")
    return _tensorflow_onednn_default(cpu_class(flags))


def kernel_summary(environ=None):
    """One line for the effective config: the CPU, its class and the oneDNN setting (and who
    chose it)."""
    environ = os.environ if environ is None else environ
    cpu = describe_cpu()
    value, reason = (CHOICES.get("TF_ENABLE_ONEDNN_OPTS")
                     or _onednn_unchosen(environ, cpu["cpu_class"]))
    return (f"cpu: {cpu['cpu']} ({cpu['cpu_class']} class, {cpu['cores']} cores); "
            f"TF_ENABLE_ONEDNN_OPTS={value} ({reason})")
