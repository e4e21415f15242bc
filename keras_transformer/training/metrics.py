"""Token-level metrics that ignore padding: accuracy and perplexity."""

import keras
from keras import ops

from keras_transformer.training.loss import smoothed_token_losses
from pipelines.special_ids import PAD_ID


class _MaskedTokenMean(keras.metrics.Metric):
    """Running mean of a per-token value over the non-padding tokens."""

    def __init__(self, name, padding_id=PAD_ID, **kwargs):
        super().__init__(name=name, **kwargs)
        self.padding_id = padding_id
        self.total = self.add_variable((), initializer="zeros", name="total")
        self.count = self.add_variable((), initializer="zeros", name="count")

    def token_values(self, y_true, y_pred):
        raise NotImplementedError

    def update_state(self, y_true, y_pred, sample_weight=None):
        mask = ops.cast(ops.not_equal(y_true, self.padding_id), "float32")
        values = ops.cast(self.token_values(y_true, y_pred), "float32")
        self.total.assign_add(ops.sum(values * mask))
        self.count.assign_add(ops.sum(mask))

    def mean(self):
        return self.total / ops.maximum(self.count, 1.0)

    def result(self):
        return self.mean()

    def get_config(self):
        return {**super().get_config(), "padding_id": self.padding_id}


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenAccuracy(_MaskedTokenMean):
    """Share of non-padding target tokens whose argmax prediction is right."""

    def __init__(self, name="token_accuracy", **kwargs):
        super().__init__(name=name, **kwargs)

    def token_values(self, y_true, y_pred):
        return ops.equal(ops.argmax(y_pred, axis=-1), ops.cast(y_true, "int32"))


@keras.saving.register_keras_serializable(package="keras_transformer")
class Perplexity(_MaskedTokenMean):
    """exp(mean negative log-likelihood) over non-padding tokens (no label smoothing)."""

    def __init__(self, name="perplexity", **kwargs):
        super().__init__(name=name, **kwargs)

    def token_values(self, y_true, y_pred):
        return smoothed_token_losses(y_true, y_pred, 0.0)

    def result(self):
        return ops.exp(ops.minimum(self.mean(), 50.0))
