"""The paper's optimizer (Section 5.3): Adam, beta_1 0.9, beta_2 0.98, epsilon 1e-9, warmup
schedule; and the run's optional changes to it: another learning-rate schedule
(training/schedule.py), gradient clipping by global norm, a moving average of the weights.

`FusedAdam` is `keras.optimizers.Adam` with TensorFlow's fused `ResourceApplyAdam` kernel doing
each dense update in one pass over the variable and its two moments. Keras' own update is a
dozen separate element-wise ops, each reading and writing whole tensors; for the base model
(63M weights, 252 MB per copy) that memory traffic is a visible share of a CPU training step
(`benchmarks/train_step.py --profile`). The arithmetic is the same:

    m <- beta_1 m + (1 - beta_1) g
    v <- beta_2 v + (1 - beta_2) g^2
    w <- w - lr sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + epsilon)

Sparse gradients, amsgrad and other backends (JAX) fall back to Keras' implementation. The
variables (iterations, momentums, velocities) are Adam's, so checkpoints are interchangeable.

The moving average (`ema_momentum`) is Keras' own (`use_ema`): the average of each weight is an
optimizer variable, so it is in every checkpoint beside Adam's moments and a resumed run
continues it exactly. Keras copies the average into the model when `fit` ends; our optimizers
do not (`finalize_variable_values` leaves the trained weights), so that every checkpoint, the
one saved at the end included, holds the trained weights a resumed run continues from. The
run's saved model takes the average through `averaged_weights`.
"""

import contextlib

import keras

from keras_transformer.training.schedule import TransformerSchedule, make_schedule


class _KeepsTrainedWeights:
    """Leaves the trained weights in the model when `fit` ends (Keras would copy the moving
    average in): the run takes the average where it saves its model (`averaged_weights`)."""

    def finalize_variable_values(self, var_list):
        del var_list

    def copy_average_into(self, var_list):
        """Sets the model's trainable variables `var_list` (in the order the optimizer was
        built with) to their moving average: what Keras does when `fit` ends."""
        super().finalize_variable_values(var_list)


def _handle(variable):
    """The resource handle of a Keras or tf.Variable (the local copy under tf.distribute)."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle


@keras.saving.register_keras_serializable(package="keras_transformer")
class AveragingAdam(_KeepsTrainedWeights, keras.optimizers.Adam):
    """Keras' Adam, keeping the trained weights when `fit` ends (for `use_ema` where the fused
    kernel is not used)."""


@keras.saving.register_keras_serializable(package="keras_transformer")
class FusedAdam(_KeepsTrainedWeights, keras.optimizers.Adam):
    """Adam with one fused TensorFlow kernel per dense variable update (same maths as Keras)."""

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad or keras.backend.backend() != "tensorflow":
            return super().update_step(gradient, variable, learning_rate)
        import tensorflow as tf

        if isinstance(gradient, tf.IndexedSlices):
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        index = self._get_variable_index(variable)
        step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        tf.raw_ops.ResourceApplyAdam(
            var=_handle(variable), m=_handle(self._momentums[index]),
            v=_handle(self._velocities[index]),
            beta1_power=tf.pow(beta_1, step), beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(learning_rate, dtype), beta1=beta_1, beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype), grad=tf.cast(gradient, dtype),
            use_locking=False,
        )


def paper_optimizer(d_model, warmup_steps=4000, lr_scale=1.0, grad_accum_steps=1, fused=None,
                    schedule=None, clip_norm=None, ema_momentum=None):
    """Adam with the paper's betas, epsilon and warmup / inverse-square-root schedule:
    `FusedAdam` on TensorFlow, Keras' own Adam on other backends (or with `fused=False`).
    The two hold the same variables, so a run's checkpoints move between backends.

    Args:
        schedule: another learning-rate schedule (default: the paper's, with `warmup_steps`
            and `lr_scale`).
        clip_norm: clip the gradients to this global norm (None: no clipping).
        ema_momentum: keep a moving average of the weights with this momentum (None: none).
    """
    if fused is None:
        fused = keras.backend.backend() == "tensorflow"
    plain = AveragingAdam if ema_momentum is not None else keras.optimizers.Adam
    extra = {} if ema_momentum is None else dict(use_ema=True, ema_momentum=ema_momentum)
    return (FusedAdam if fused else plain)(
        schedule or TransformerSchedule(d_model, warmup_steps, scale=lr_scale),
        beta_1=0.9, beta_2=0.98, epsilon=1e-9, global_clipnorm=clip_norm,
        gradient_accumulation_steps=grad_accum_steps if grad_accum_steps > 1 else None,
        **extra,
    )


def run_optimizer(d_model, settings):
    """The optimizer of a run's optimization settings (`runs.sections.OptimizationSettings`,
    resolved): its schedule, gradient accumulation, clipping and moving average."""
    schedule = make_schedule(settings.lr_schedule, d_model, settings.warmup_steps,
                             settings.train_steps, settings.lr_scale, settings.peak_lr,
                             settings.cooldown_fraction)
    return paper_optimizer(d_model, grad_accum_steps=settings.grad_accum_steps,
                           schedule=schedule, clip_norm=settings.clip_norm,
                           ema_momentum=settings.ema_momentum)


def uses_moving_average(optimizer):
    """Whether `optimizer` (or the one a LossScaleOptimizer wraps) keeps a moving average."""
    return bool(getattr(getattr(optimizer, "inner_optimizer", optimizer), "use_ema", False))


@contextlib.contextmanager
def averaged_weights(model):
    """Within the block, `model` holds its optimizer's moving average of the weights in place
    of the trained weights, which are put back, exactly, after it; nothing changes without a
    moving average."""
    optimizer = getattr(model, "optimizer", None)
    if not uses_moving_average(optimizer):
        yield model
        return
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    variables = model.trainable_variables
    trained = [keras.ops.convert_to_numpy(variable) for variable in variables]
    optimizer.copy_average_into(variables)
    try:
        yield model
    finally:
        for variable, value in zip(variables, trained):
            variable.assign(value)
