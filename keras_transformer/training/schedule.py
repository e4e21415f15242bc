"""The paper's learning-rate schedule (Section 5.3)."""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5).

    Linear warm-up for `warmup_steps`, then decay with the inverse square root of the step.
    Keras passes the number of finished updates (0 for the first); step 0 is treated as step 1.

    Args:
        d_model: model width.
        warmup_steps: paper: 4000.
        scale: multiplier on the whole schedule (paper: 1.0).
    """

    def __init__(self, d_model, warmup_steps=4000, scale=1.0):
        if d_model <= 0 or warmup_steps <= 0:
            raise ValueError(
                f"d_model={d_model} and warmup_steps={warmup_steps} must both be positive."
            )
        self.d_model = d_model
        self.warmup_steps = warmup_steps
        self.scale = scale

    def __call__(self, step):
        step = ops.maximum(ops.cast(step, "float32"), 1.0)
        return (
            self.scale
            * self.d_model**-0.5
            * ops.minimum(ops.power(step, -0.5), step * self.warmup_steps**-1.5)
        )

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps, "scale": self.scale}
