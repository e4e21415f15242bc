"""Learning-rate schedules: the paper's (Section 5.3), and warmup followed by a decay to zero at
the last step (linear, cosine, warmup-stable-decay) for runs of a fixed, short budget.

Every schedule is a Keras `LearningRateSchedule`, registered and with `get_config`, so that a
compiled model saves and loads with it. Keras passes the number of finished updates (0 for the
first); every schedule here treats step 0 as step 1, so that no update has a rate of zero.

    TransformerSchedule(d_model=256, warmup_steps=800)              # the paper's
    WarmupCosineDecay(peak_learning_rate=2e-3, warmup_steps=100, total_steps=1200)
    WarmupStableDecay(2e-3, warmup_steps=100, total_steps=1200, cooldown_fraction=0.25)

References:
    Vaswani et al., 2017, "Attention Is All You Need", Section 5.3.
    Loshchilov and Hutter, 2017, "SGDR: Stochastic Gradient Descent with Warm Restarts" (the
    cosine shape).
    Li, Yumer and Ramanan, 2020, "Budgeted Training: Rethinking Deep Neural Network Training
    Under Resource Constraints" (a decay to zero at the budget's end).
    Hägele et al., 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training
    Durations" (warmup-stable-decay, a cooldown over the last steps).
"""

import math

import keras
from keras import ops

# The `lr_schedule` setting's values, each the class it builds.
INVERSE_SQRT, LINEAR, COSINE, WSD = "inverse_sqrt", "linear", "cosine", "wsd"


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


def paper_peak(d_model, warmup_steps):
    """The paper schedule's highest rate (at the end of its warmup): (d_model * warmup)^-0.5."""
    return (d_model * warmup_steps) ** -0.5


class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """A linear warmup from 0 to `peak_learning_rate` over `warmup_steps`, then `decay(step)`,
    which a subclass defines: a fraction of the peak that reaches 0 at `total_steps` (the
    run's train_steps) and stays 0 after it.

        lrate = peak * step / warmup_steps              for step < warmup_steps
        lrate = peak * decay(step)                      after

    Args:
        peak_learning_rate: the rate at the end of the warmup.
        warmup_steps: steps of the warmup (fewer than `total_steps`).
        total_steps: the step at which the rate reaches 0.
    """

    def __init__(self, peak_learning_rate, warmup_steps, total_steps):
        if not peak_learning_rate > 0:
            raise ValueError(f"peak_learning_rate={peak_learning_rate} must be positive.")
        if not 0 < warmup_steps < total_steps:
            raise ValueError(f"warmup_steps={warmup_steps} must be positive and fewer than "
                             f"total_steps={total_steps}: the rate decays after the warmup.")
        self.peak_learning_rate = peak_learning_rate
        self.warmup_steps = warmup_steps
        self.total_steps = total_steps

    def __call__(self, step):
        step = ops.maximum(ops.cast(step, "float32"), 1.0)
        warmup = step / float(self.warmup_steps)
        return self.peak_learning_rate * ops.where(step < self.warmup_steps, warmup,
                                                   self.decay(step))

    def progress(self, step, start):
        """How far `step` is from `start` to total_steps, clipped to [0, 1]."""
        return ops.clip((step - start) / float(self.total_steps - start), 0.0, 1.0)

    def decay(self, step):
        raise NotImplementedError

    def get_config(self):
        return {"peak_learning_rate": self.peak_learning_rate,
                "warmup_steps": self.warmup_steps, "total_steps": self.total_steps}


@keras.saving.register_keras_serializable(package="keras_transformer")
class WarmupLinearDecay(WarmupDecay):
    """Warmup, then a straight line from the peak to 0 at total_steps:
    decay = 1 - p, p = (step - warmup_steps) / (total_steps - warmup_steps)."""

    def decay(self, step):
        return 1.0 - self.progress(step, float(self.warmup_steps))


@keras.saving.register_keras_serializable(package="keras_transformer")
class WarmupCosineDecay(WarmupDecay):
    """Warmup, then half a cosine from the peak to 0 at total_steps:
    decay = (1 + cos(pi * p)) / 2, p as in `WarmupLinearDecay`."""

    def decay(self, step):
        return 0.5 * (1.0 + ops.cos(math.pi * self.progress(step, float(self.warmup_steps))))


@keras.saving.register_keras_serializable(package="keras_transformer")
class WarmupStableDecay(WarmupDecay):
    """Warmup, the peak held (stable), then a straight line to 0 over the last
    `cooldown_fraction` of total_steps (the cooldown starts at total_steps * (1 -
    cooldown_fraction), or at the warmup's end if that is later).

    Args:
        cooldown_fraction: the share of total_steps the cooldown takes, in (0, 1].
    """

    def __init__(self, peak_learning_rate, warmup_steps, total_steps, cooldown_fraction=0.25):
        super().__init__(peak_learning_rate, warmup_steps, total_steps)
        if not 0 < cooldown_fraction <= 1:
            raise ValueError(f"cooldown_fraction={cooldown_fraction} must be in (0, 1].")
        self.cooldown_fraction = cooldown_fraction

    @property
    def cooldown_start(self):
        return max(float(self.warmup_steps), self.total_steps * (1.0 - self.cooldown_fraction))

    def decay(self, step):
        return 1.0 - self.progress(step, self.cooldown_start)

    def get_config(self):
        return {**super().get_config(), "cooldown_fraction": self.cooldown_fraction}


DECAYS = {LINEAR: WarmupLinearDecay, COSINE: WarmupCosineDecay, WSD: WarmupStableDecay}
SCHEDULES = (INVERSE_SQRT, *DECAYS)


def make_schedule(name, d_model, warmup_steps, train_steps=None, lr_scale=1.0, peak_lr=None,
                  cooldown_fraction=0.25):
    """The schedule a run's settings name (`lr_schedule`).

    The peak is `peak_lr` when given, else the paper schedule's peak with this width and
    warmup, `paper_peak(d_model, warmup_steps)`; `lr_scale` multiplies it in every schedule.
    With `inverse_sqrt` and no `peak_lr` this is `TransformerSchedule(d_model, warmup_steps,
    scale=lr_scale)`, the paper's schedule as it always was. The decaying schedules reach 0 at
    `train_steps`.
    """
    if name == INVERSE_SQRT:
        scale = lr_scale if peak_lr is None else lr_scale * peak_lr / paper_peak(d_model,
                                                                                   warmup_steps)
        return TransformerSchedule(d_model, warmup_steps, scale=scale)
    if name not in DECAYS:
        raise ValueError(f"lr_schedule={name!r} is not one of {', '.join(SCHEDULES)}.")
    if train_steps is None:
        raise ValueError(f"lr_schedule={name!r} decays to 0 at the last step: give train_steps.")
    peak = lr_scale * (paper_peak(d_model, warmup_steps) if peak_lr is None else peak_lr)
    extra = {"cooldown_fraction": cooldown_fraction} if name == WSD else {}
    return DECAYS[name](peak, warmup_steps, train_steps, **extra)
