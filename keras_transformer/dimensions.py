"""The attention's sizes rule, shared by the layers, the model and a run's config (which reads
it without importing Keras: a run opened by the CTranslate2 engine's commands)."""


def check_dimensions(d_model, num_heads, key_dim=None, value_dim=None):
    """Validates the attention sizes; returns (key_dim, value_dim) with defaults d_model / h."""
    for name, value in (("d_model", d_model), ("num_heads", num_heads)):
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}={value!r} must be a positive integer.")
    if (key_dim is None or value_dim is None) and d_model % num_heads:
        raise ValueError(
            f"d_model={d_model} is not divisible by num_heads={num_heads}; "
            "choose sizes that divide, or set key_dim and value_dim explicitly."
        )
    return key_dim or d_model // num_heads, value_dim or d_model // num_heads
