"""A model computing in another dtype: a copy built once with that Keras dtype policy, holding
the original's weights cast to it. Decoding uses it for bf16 (`decoding.engines.precision`); a run
loads its models in float32 through it, whatever policy they were trained under (a mixed
policy keeps float32 variables, so nothing is lost)."""

import keras


def _plain(model, dtype):
    """Whether `model` already computes in `dtype` with variables of `dtype` (no copy)."""
    policy = model.dtype_policy
    return policy.compute_dtype == dtype and policy.variable_dtype == dtype


def cast_model(model, dtype):
    """`model` computing in `dtype` ("float32" or "bfloat16").

    The model itself when its dtype policy already is `dtype` (a float32 model stays itself
    for "float32"); else a copy built from its config with the dtype policy `dtype` (bfloat16:
    the LayerNorms' weights stay float32), holding its weights cast once, here. An `Ensemble`
    gets an ensemble of its members, each as above.
    """
    members = getattr(model, "members", None)
    if members is not None:
        cast = [cast_model(member, dtype) for member in members]
        if all(c is m for c, m in zip(cast, members)):
            return model
        return type(model)(cast, name=model.name)
    if _plain(model, dtype):
        return model
    copy = type(model).from_config({**model.get_config(), "dtype": _policy(dtype)})
    copy.build()
    norms = [layer for layer in copy._flatten_layers()
             if isinstance(layer, keras.layers.LayerNormalization)]
    if any(v.dtype != "float32" for layer in norms for v in layer.weights):
        raise ValueError(f"a LayerNormalization of {model.name} did not keep float32 weights "
                         f"(its path does not match {LAYER_NORMS!r}).")
    copy_weights(model, copy)
    return copy


# The layers of a bfloat16 copy that keep float32 weights (a regular expression on the path).
LAYER_NORMS = ".*layer_norm"


def _policy(dtype):
    """The Keras dtype policy of a copy computing in `dtype`."""
    if dtype != "bfloat16":
        return dtype
    return keras.dtype_policies.DTypePolicyMap(
        default_policy="bfloat16",
        policy_map={LAYER_NORMS: keras.dtype_policies.DTypePolicy("mixed_bfloat16")})


def copy_weights(source, target):
    """Assigns `source`'s weights to `target`'s (the same architecture), cast to theirs."""
    pairs = list(zip(source.weights, target.weights))
    if len(source.weights) != len(target.weights) or any(
            a.path != b.path or tuple(a.shape) != tuple(b.shape) for a, b in pairs):
        raise ValueError(f"the copy of {source.name} does not have its weights.")
    for a, b in pairs:
        b.assign(keras.ops.cast(a.value, b.dtype))
