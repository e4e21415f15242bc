"""The precision a search computes in: float32, or bfloat16 where the CPU has bf16 units.

    dtype, reason = resolve_precision("auto")   # "bfloat16" on the amx / avx512_bf16 classes
    model = cast_model(model, dtype)            # a copy whose weights are bfloat16, cast once

On CPUs with bf16 matrix units (AMX, AVX-512 BF16) a beam search of the base preset runs about
1.4x faster in bfloat16 with the same output on most sentences; elsewhere bfloat16 is several
times slower (no bf16 units: every product is emulated), so "auto" keeps float32 there.

The cast is done once, when the translator is built: the copy has Keras' "bfloat16" dtype
policy, so its matrices are bfloat16 variables and no step casts a weight (under
"mixed_bfloat16", the training policy, every call would cast every float32 kernel again).
The LayerNorms keep their gain and bias in float32 (they normalize in float32 anyway; in
bfloat16 those few weights cost a BLEU point: Multi30k val, quick run, beam 4, alpha 1.4,
float32 36.72, all-bf16 35.75, bf16 with float32 LayerNorms 36.72). The logits come out as
float32 (`Transformer.logits`), and the search's log-softmax, scores and length penalty stay
float32 (`search.greedy_search`, `beam_search.beam_search`).

"auto" picks float32 under JAX (its CPU kernels have no fast bf16 path here; on a GPU the
search has not been measured in bf16); "bfloat16" runs there too.
"""

import keras

from keras_transformer.errors import InputError
from keras_transformer.models.casting import cast_model, copy_weights  # noqa: F401  (re-exported)

DTYPES = ("float32", "bfloat16")  # what a search computes in
PRECISIONS = ("auto", *DTYPES)  # the setting: "auto" resolves to one of DTYPES


def resolve_precision(precision="auto", flags=None):
    """("float32" or "bfloat16", a one-line reason for people) for a precision setting;
    `flags`: the CPU's feature flags (default: this CPU's)."""
    from keras_transformer import hardware

    if precision not in PRECISIONS:
        raise InputError(f"precision={precision!r} must be one of {', '.join(PRECISIONS)}.")
    if precision != "auto":
        name = "bf16" if precision == "bfloat16" else "float32"
        return precision, f"{name}: --precision {precision} given"
    backend = keras.backend.backend()
    if backend != "tensorflow":
        return "float32", (f"float32: {backend} (bf16 decoding is chosen under TensorFlow, "
                           "whose oneDNN kernels use the CPU's bf16 units); --precision "
                           "bfloat16 forces it")
    kind = hardware.cpu_class(flags)
    if hardware.has_bf16(flags):
        units = "AMX (amx_bf16)" if kind == "amx" else "avx512_bf16"
        return "bfloat16", f"bf16: this CPU has {units}; --precision float32 restores float32"
    return "float32", (f"float32: this CPU ({kind} class) has no bf16 units, where bf16 is "
                       "slower; --precision bfloat16 forces it")
