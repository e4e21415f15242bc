"""The paper's optimizer (Section 5.3): Adam, beta_1 0.9, beta_2 0.98, epsilon 1e-9, warmup schedule.

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
"""

import keras

from keras_transformer.training.schedule import TransformerSchedule


def _handle(variable):
    """The resource handle of a Keras or tf.Variable (the local copy under tf.distribute)."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle


@keras.saving.register_keras_serializable(package="keras_transformer")
class FusedAdam(keras.optimizers.Adam):
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


def paper_optimizer(d_model, warmup_steps=4000, lr_scale=1.0, grad_accum_steps=1, fused=None):
    """Adam with the paper's betas, epsilon and warmup / inverse-square-root schedule:
    `FusedAdam` on TensorFlow, Keras' own Adam on other backends (or with `fused=False`).
    The two hold the same variables, so a run's checkpoints move between backends."""
    if fused is None:
        fused = keras.backend.backend() == "tensorflow"
    return (FusedAdam if fused else keras.optimizers.Adam)(
        TransformerSchedule(d_model, warmup_steps, scale=lr_scale),
        beta_1=0.9, beta_2=0.98, epsilon=1e-9,
        gradient_accumulation_steps=grad_accum_steps if grad_accum_steps > 1 else None,
    )
