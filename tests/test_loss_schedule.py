import math

import numpy as np
import pytest

from keras_transformer.training.loss import LabelSmoothedCrossEntropy
from keras_transformer.training.metrics import Perplexity, TokenAccuracy
from keras_transformer.training.schedule import TransformerSchedule


@pytest.mark.parametrize("step", [1, 4000, 100000])
def test_schedule_equals_the_paper_formula(step):
    schedule = TransformerSchedule(d_model=512, warmup_steps=4000)
    expected = 512**-0.5 * min(step**-0.5, step * 4000**-1.5)
    assert float(schedule(step)) == pytest.approx(expected, rel=1e-6)


def test_schedule_peaks_at_warmup_and_round_trips_config():
    schedule = TransformerSchedule(d_model=512, warmup_steps=4000)
    rates = [float(schedule(s)) for s in (3999, 4000, 4001)]
    assert rates[1] == max(rates)
    assert float(schedule(0)) == float(schedule(1))  # Keras counts finished updates from 0
    clone = TransformerSchedule.from_config(schedule.get_config())
    assert float(clone(123)) == float(schedule(123))
    with pytest.raises(ValueError, match="warmup_steps=0"):
        TransformerSchedule(512, warmup_steps=0)


LOGITS = np.array([[[2.0, 0.5, -1.0, 0.0], [0.1, 0.2, 0.3, 0.4], [5.0, -5.0, 3.0, 1.0]]],
                  "float32")
LABELS = np.array([[2, 1, 0]])  # the last position is padding


def hand_loss(eps):
    total = 0.0
    for t in range(2):  # real positions only
        z = LOGITS[0, t].astype(np.float64)
        log_p = z - math.log(np.exp(z).sum())
        q = np.full(4, eps / 4)
        q[LABELS[0, t]] += 1 - eps
        total += -(q * log_p).sum()
    return total / 2


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.2])
def test_label_smoothed_loss_equals_hand_computation(eps):
    loss = LabelSmoothedCrossEntropy(label_smoothing=eps)
    assert float(loss(LABELS, LOGITS)) == pytest.approx(hand_loss(eps), rel=1e-5)


def test_loss_ignores_padding_positions():
    loss = LabelSmoothedCrossEntropy(0.1)
    changed = LOGITS.copy()
    changed[0, 2] = [-40.0, 70.0, 3.0, 9.0]  # logits at the padded position
    assert float(loss(LABELS, changed)) == pytest.approx(float(loss(LABELS, LOGITS)))
    with pytest.raises(ValueError, match="label_smoothing=1.5"):
        LabelSmoothedCrossEntropy(1.5)


def test_metrics_ignore_padding():
    accuracy = TokenAccuracy()
    accuracy.update_state(LABELS, LOGITS)  # argmax: 0 (wrong), 3 (wrong), 0 (padding)
    assert float(accuracy.result()) == 0.0
    right = LOGITS.copy()
    right[0, 0, 2] = 10.0
    accuracy.reset_state()
    accuracy.update_state(LABELS, right)
    assert float(accuracy.result()) == pytest.approx(0.5)
    perplexity = Perplexity()
    perplexity.update_state(LABELS, LOGITS)
    assert float(perplexity.result()) == pytest.approx(math.exp(hand_loss(0.0)), rel=1e-5)


def _fit_regression(optimizer, steps=20):
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.Dense(3)])
    model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 6)), rng.normal(size=(32, 3))
    model.fit(x, y, batch_size=8, epochs=steps // 4, shuffle=False, verbose=0)
    return model


def test_fused_adam_matches_keras_adam_and_saves():
    import keras

    from keras_transformer.training.optimizer import FusedAdam, paper_optimizer

    fused = _fit_regression(paper_optimizer(8, warmup_steps=5))
    plain = _fit_regression(paper_optimizer(8, warmup_steps=5, fused=False))
    assert isinstance(fused.optimizer, FusedAdam)
    assert int(fused.optimizer.iterations) == 20
    for a, b in zip(fused.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(fused.optimizer.variables, plain.optimizer.variables):  # step and moments
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)
    clone = keras.optimizers.deserialize(keras.optimizers.serialize(fused.optimizer))
    assert isinstance(clone, FusedAdam) and clone.beta_2 == 0.98 and clone.epsilon == 1e-9


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_fused_loss_gradient_equals_autodiff_of_the_formula(eps):
    import tensorflow as tf

    from keras_transformer.training.loss import smoothed_token_losses

    rng = np.random.default_rng(1)
    logits = tf.constant(rng.normal(size=(3, 5, 11)).astype("float32") * 3)
    labels = tf.constant(rng.integers(0, 11, (3, 5)).astype("int32"))
    weights = tf.constant(rng.normal(size=(3, 5)).astype("float32"))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        fused = tf.reduce_sum(smoothed_token_losses(labels, logits, eps) * weights)
        lse = tf.reduce_logsumexp(logits, -1)
        target = tf.gather(logits, labels[..., None], batch_dims=2)[..., 0]
        formula = (1 - eps) * (lse - target) + eps * (lse - tf.reduce_mean(logits, -1))
        reference = tf.reduce_sum(formula * weights)
    assert float(fused) == pytest.approx(float(reference), rel=1e-5)
    np.testing.assert_allclose(tape.gradient(fused, logits), tape.gradient(reference, logits),
                               atol=1e-6)
