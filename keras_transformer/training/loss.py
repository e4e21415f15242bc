"""Label-smoothed cross-entropy that ignores padding (paper Section 5.4)."""

import keras
import numpy as np
from keras import ops

from pipelines.special_ids import PAD_ID


def global_token_count(local_count):
    """Non-padding tokens of the whole global batch: summed over replicas under tf.distribute
    (TensorFlow backend; under JAX, Keras' data parallelism sees the global batch as one)."""
    if keras.backend.backend() != "tensorflow":
        return local_count
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return local_count
    return context.all_reduce(tf.distribute.ReduceOp.SUM, local_count)


def smoothed_token_losses(labels, logits, label_smoothing):
    """Per-token cross-entropy against the smoothed target distribution.

    q = (1 - eps) * onehot(y) + eps / V (uniform over the whole vocabulary), so

        -sum_j q_j log p_j = (1 - eps) * (lse - z_y) + eps * (lse - mean_j z_j)

    with lse = logsumexp(z). The (B, T, V) logits are the largest tensors of a training step
    (4096 tokens x 37000 pieces = 606 MB in float32), so the loss touches them as few times as
    it can: one softmax gives -log p_y = lse - z_y and, kept for the backward pass, the
    gradient. On TensorFlow the gradient is written by hand as (softmax - eps / V) * upstream
    with (1 - eps) * upstream taken off at the labels, instead of autodiff's chain of
    broadcasts, a scatter into a zero (B, T, V) tensor and a sum of them; the logits
    themselves are not kept for the backward pass. Elsewhere (JAX) the loss is written as
    reductions of the logits (`_logsumexp_losses`) that XLA fuses with their cast to float32:
    no float32 (B, T, V) copy, softmax or probability tensor is kept, and autodiff's gradient
    exp(z - lse) - q is one fused element-wise pass written in the logits' own dtype.

    Args:
        labels: int (B, T), each in [0, V).
        logits: (B, T, V).
        label_smoothing: eps in [0, 1).

    Returns:
        float32 (B, T) losses (padding positions included; mask them yourself).
    """
    labels = ops.cast(labels, "int32")
    shape = ops.shape(labels)
    vocab = ops.shape(logits)[-1]
    flat_logits = ops.reshape(logits, (-1, vocab))
    flat_labels = ops.reshape(labels, (-1,))
    eps = float(label_smoothing)
    if keras.backend.backend() == "tensorflow":
        losses = _tensorflow_fused_losses(ops.cast(flat_logits, "float32"), flat_labels, eps)
    else:
        losses = _logsumexp_losses(flat_logits, flat_labels, eps)
    return ops.reshape(losses, shape)


def _logsumexp_losses(logits, labels, eps):
    """(N, V) logits of any float dtype, (N,) labels -> (N,) float32 label-smoothed losses.

    lse - z_y and lse - mean_j z_j, each reduction taking the logits up to float32 as it
    reads them (under XLA the cast fuses into the reduction, so bf16 logits are never copied
    to float32 whole). The same values as `_smoothed_losses_and_probs`, without its floor at
    87 on a token's loss."""
    wide = ops.cast(logits, "float32")
    lse = ops.logsumexp(wide, axis=-1)
    nll = lse - ops.take_along_axis(wide, labels[:, None], axis=1)[:, 0]
    if not eps:
        return nll
    return (1.0 - eps) * nll + eps * (lse - ops.mean(wide, axis=-1))


def _smoothed_losses_and_probs(logits, labels, eps):
    """(N, V) float32 logits, (N,) labels -> ((N,) label-smoothed losses, (N, V) softmax).

    One softmax serves the loss (and, on TensorFlow, the gradient): lse - z_y = -log p_y, so
    lse = z_y - log p_y. A p_y below float32's smallest normal number is read as that number
    (a token loss above 87 is reported as 87).
    """
    tiny = float(np.finfo(np.float32).tiny)
    probs = ops.softmax(logits, axis=-1)
    target_prob = ops.take_along_axis(probs, labels[:, None], axis=1)[:, 0]
    nll = -ops.log(ops.maximum(target_prob, tiny))
    if not eps:
        return nll, probs
    target_logit = ops.take_along_axis(logits, labels[:, None], axis=1)[:, 0]
    lse = target_logit + nll
    return (1.0 - eps) * nll + eps * (lse - ops.mean(logits, axis=-1)), probs


def _tensorflow_fused_losses(logits, labels, eps):
    """The losses with a hand-written gradient (TensorFlow: oneDNN's softmax is several times
    faster on CPU than SparseSoftmaxCrossEntropyWithLogits, and the gradient reuses it)."""
    import tensorflow as tf

    @ops.custom_gradient
    def losses_of(logits):
        losses, probs = _smoothed_losses_and_probs(logits, labels, eps)

        def grad(upstream):
            # d loss / d z = softmax - (1 - eps) onehot(y) - eps / V
            upstream = tf.cast(upstream, tf.float32)[:, None]
            vocab = tf.cast(tf.shape(probs)[-1], tf.float32)
            gradient = (probs - eps / vocab) * upstream if eps else probs * upstream
            rows = tf.range(tf.shape(labels)[0])
            return tf.tensor_scatter_nd_sub(gradient, tf.stack([rows, labels], axis=1),
                                            (1.0 - eps) * upstream[:, 0])

        return losses, grad

    return losses_of(logits)


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Mean label-smoothed cross-entropy over the non-padding target tokens of a batch.

    Under tf.distribute the mean is over the tokens of the *global* batch (the token count is
    summed across replicas): each replica returns its token-loss sum divided by the global
    count, and the replicas' gradients are summed, so replicas holding different numbers of
    tokens train exactly like one device on the whole batch. (Keras leaves a scalar loss as
    it is: it divides only unreduced losses by the number of replicas.)

    Args:
        label_smoothing: eps_ls (paper: 0.1).
        padding_id: label id that carries no loss (0).

    Call arguments:
        y_true: int labels (B, T); `padding_id` marks padding.
        y_pred: logits (B, T, V).
    """

    def __init__(self, label_smoothing=0.1, padding_id=PAD_ID, name="label_smoothed_ce", **kwargs):
        super().__init__(name=name, **kwargs)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 1).")
        self.label_smoothing = label_smoothing
        self.padding_id = padding_id

    def call(self, y_true, y_pred):
        losses = smoothed_token_losses(y_true, y_pred, self.label_smoothing)
        mask = ops.cast(ops.not_equal(y_true, self.padding_id), "float32")
        total = global_token_count(ops.sum(mask))
        return ops.sum(losses * mask) / ops.maximum(total, 1.0)

    def get_config(self):
        return {
            **super().get_config(),
            "label_smoothing": self.label_smoothing,
            "padding_id": self.padding_id,
        }
