"""Length buckets shared by the tf.data batching (`pipelines.batching`) and the prepared data's
batch plan (`pipelines.prepared`); plain Python, so the plan needs no TensorFlow."""


def geometric_boundaries(max_length, min_boundary=8, growth=1.1):
    """Bucket upper bounds: min_boundary, then each about `growth` times the last (at least +1),
    the last one equal to max_length."""
    if growth <= 1.0:
        raise ValueError(f"growth={growth} must be larger than 1.")
    bounds = [min(min_boundary, max_length)]
    while bounds[-1] < max_length:
        bounds.append(min(max_length, max(bounds[-1] + 1, int(bounds[-1] * growth))))
    return bounds
