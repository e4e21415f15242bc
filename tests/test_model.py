import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer
from keras_transformer.training.loss import LabelSmoothedCrossEntropy

VOCAB = 50


def tiny(**overrides):
    model = Transformer.from_preset("tiny", vocab_size=VOCAB, dropout=0.0, **overrides)
    model.build()
    return model


def ids(shape, seed=0):
    return np.random.default_rng(seed).integers(1, VOCAB, size=shape).astype("int32")


@pytest.mark.parametrize("overrides", [{}, {"norm_first": True, "positional": "learned",
                                             "max_length": 32}])
def test_causal_masking(overrides):
    model = tiny(**overrides)
    src, tgt = ids((2, 7)), ids((2, 9), seed=1)
    before = np.asarray(model((src, tgt)))
    for t in range(tgt.shape[1] - 1):
        changed = tgt.copy()
        changed[:, t + 1 :] = ids((2, tgt.shape[1] - t - 1), seed=2 + t)
        after = np.asarray(model((src, changed)))
        np.testing.assert_allclose(after[:, : t + 1], before[:, : t + 1], atol=1e-5)
        assert not np.allclose(after[:, t + 1 :], before[:, t + 1 :], atol=1e-5)


def test_padding_leaves_real_positions_unchanged():
    model = tiny()
    src, tgt = ids((2, 6)), ids((2, 5), seed=1)
    reference = np.asarray(model((src, tgt)))
    padded_src = np.pad(src, ((0, 0), (0, 4)))
    padded_tgt = np.pad(tgt, ((0, 0), (0, 3)))
    np.testing.assert_allclose(model((padded_src, tgt)), reference, atol=1e-5)
    np.testing.assert_allclose(
        np.asarray(model((padded_src, padded_tgt)))[:, :5], reference, atol=1e-5
    )
    # Sentences of different lengths in one batch: row 0 is shorter, padded with zeros.
    mixed_src = src.copy()
    mixed_src[0, 4:] = 0
    alone = np.asarray(model((src[:1, :4], tgt[:1])))
    np.testing.assert_allclose(np.asarray(model((mixed_src, tgt)))[:1], alone, atol=1e-5)


@pytest.mark.parametrize("overrides", [{}, pytest.param({"norm_first": True}, marks=pytest.mark.slow),
                                       {"key_dim": 3, "value_dim": 5}])
def test_cached_decoding_reproduces_full_forward_pass(overrides):
    model = tiny(**overrides)
    src = ids((3, 7))
    src[1, 5:] = 0  # a padded source row
    tgt = ids((3, 6), seed=1)
    full = np.asarray(model((src, tgt)))

    encoder_output, source_mask = model.encode(src)
    cache = model.init_cache(encoder_output, source_mask, max_length=10)
    step = tf.function(model.decode_step)
    for i in range(tgt.shape[1]):
        logits, cache = step(tgt[:, i : i + 1], cache, tf.constant(i))
        np.testing.assert_allclose(logits[:, 0], full[:, i], atol=1e-4)

    # Several tokens at once from a cache position also match.
    cache = model.init_cache(encoder_output, source_mask, max_length=10)
    logits, cache = model.decode_step(tgt[:, :4], cache, 0)
    np.testing.assert_allclose(logits, full[:, :4], atol=1e-4)
    logits, _ = model.decode_step(tgt[:, 4:], cache, 4)
    np.testing.assert_allclose(logits, full[:, 4:], atol=1e-4)

    # A cache that grows (TensorFlow's graphs): one token, then several, then one again.
    cache = model.init_cache(encoder_output, source_mask, max_length=10, grow=True)
    assert cache["grow"] and cache["self"][0][0].shape[2] == 0
    for start, stop in ((0, 1), (1, 4), (4, 5), (5, 6)):
        logits, cache = model.decode_step(tgt[:, start:stop], cache, start)
        np.testing.assert_allclose(logits, full[:, start:stop], atol=1e-4)
    assert cache["self"][0][0].shape[2] == tgt.shape[1]


def test_model_saves_and_loads_with_identical_outputs(tmp_path):
    model = tiny(target_vocab_size=40)
    src, tgt = ids((2, 5)), ids((2, 4), seed=1) % 40
    expected = np.asarray(model((src, tgt)))
    path = tmp_path / "m.keras"
    model.save(path)
    restored = keras.models.load_model(path)
    assert isinstance(restored, Transformer)
    assert restored.get_config() == model.get_config()
    np.testing.assert_allclose(restored((src, tgt)), expected, atol=1e-6)


def test_separate_vocabularies():
    shared = tiny()
    separate = tiny(target_vocab_size=30)
    untied = tiny(target_vocab_size=30, tie_output=False)
    assert separate((ids((1, 3)), ids((1, 2)) % 30)).shape == (1, 2, 30)
    d = 32
    assert separate.count_params() - shared.count_params() == 30 * d
    assert untied.count_params() - separate.count_params() == 30 * d


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: Transformer(100, d_model=510, num_heads=8), "d_model=510"),
        (lambda: Transformer(100, dropout=-0.2), "dropout=-0.2"),
        (lambda: Transformer(0), "vocab_size=0"),
        (lambda: Transformer.from_preset("huge", vocab_size=100), "Unknown preset 'huge'"),
    ],
)
def test_invalid_model_configurations(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.slow
def test_tiny_model_overfits_a_few_pairs_with_fit():
    # Five "translations": the target is the source reversed, shifted into another id range.
    rng = np.random.default_rng(3)
    bos, eos = 1, 2
    sources, targets = [], []
    for length in (3, 4, 5, 6, 4):
        src = rng.integers(3, 20, size=length)
        sources.append(list(src) + [eos])
        targets.append([bos] + list(src[::-1] + 20) + [eos])
    width = max(map(len, targets))
    src = np.array([s + [0] * (8 - len(s)) for s in sources], "int32")
    tgt = np.array([t + [0] * (width - len(t)) for t in targets], "int32")
    decoder_in, labels = tgt[:, :-1], tgt[:, 1:]

    # One layer each side: it learns them as the preset's two do, on a graph half the size.
    model = Transformer.from_preset("tiny", vocab_size=VOCAB, dropout=0.0, num_layers=1)
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=LabelSmoothedCrossEntropy(label_smoothing=0.0),
    )
    # 70 epochs of the one batch: the loss 4.55 at the first, 0.026 at the last. A repeated
    # dataset, one step an epoch, keeps its iterator across epochs (numpy arrays make one
    # each epoch: 24 CPU-s for this fit instead of 17).
    batch = tf.data.Dataset.from_tensors(((src, decoder_in), labels)).repeat()
    history = model.fit(batch, steps_per_epoch=1, epochs=70, shuffle=False, verbose=0)
    assert history.history["loss"][0] > 2.5
    assert history.history["loss"][-1] < 0.05
    predictions = np.argmax(model.predict((src, decoder_in), verbose=0), axis=-1)
    assert np.all(predictions[labels != 0] == labels[labels != 0])
