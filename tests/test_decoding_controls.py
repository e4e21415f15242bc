"""Target prefixes, sampling, n-best and scoring on the search core (TensorFlow; the JAX
agreement is in test_search_jax.py). `make test-fast` keeps the cheapest of each kind: the
rules of top-k/top-p, top_k=1 = greedy, a prefix of greedy's own output."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.decoding.search.beam_search import compiled_beam_search
from keras_transformer.decoding.search.sampling import RandomSampler, compiled_sample_search
from keras_transformer.decoding.search.scoring import compiled_scorer
from keras_transformer.decoding.search.greedy import compiled_greedy_search
from keras_transformer.decoding.search.rules import NEG_INF
from keras_transformer.errors import InputError
from tests.search_helpers import tiny_model
from tests.test_search import VOCAB, hypotheses, sources


@pytest.fixture(scope="module")
def model():
    return tiny_model(VOCAB, seed=11)


# The searches several tests run, each traced once for the file (a compiled search traces once
# for every batch shape, so sharing it only saves tracing).
@pytest.fixture(scope="module")
def greedy(model):
    return compiled_greedy_search(model)


@pytest.fixture(scope="module")
def greedy_forced(model):
    return compiled_greedy_search(model, with_prefix=True)


@pytest.fixture(scope="module")
def scorer(model):
    return compiled_scorer(model)


def prefix_of(ids, k):
    """The first k tokens of each row (stopping before EOS), 0-padded to width max(k, 1)."""
    rows = [list(h[:-1])[:k] for h in hypotheses(ids)]
    out = np.zeros((len(rows), max(k, 1)), np.int32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


@pytest.mark.slow
def test_an_empty_prefix_gives_the_unconstrained_output(model, greedy, greedy_forced):
    src = sources(seed=3)
    empty = np.zeros((len(src), 1), np.int32)
    free = compiled_beam_search(model, 4, 0.6)(src)
    forced = compiled_beam_search(model, 4, 0.6, with_prefix=True)(src, empty)
    np.testing.assert_array_equal(free["ids"], forced["ids"])
    np.testing.assert_allclose(free["scores"], forced["scores"], atol=1e-6)
    np.testing.assert_array_equal(greedy(src)[0], greedy_forced(src, empty)[0])


@pytest.mark.parametrize("k", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_a_prefix_of_greedys_output_gives_it_back(greedy, greedy_forced, k):
    src = sources(seed=4)
    greedy_ids, greedy_scores = greedy(src)
    ids, scores = greedy_forced(src, prefix_of(greedy_ids, k))
    assert hypotheses(ids) == hypotheses(greedy_ids)
    np.testing.assert_allclose(scores, greedy_scores, atol=1e-4)


@pytest.mark.slow
def test_a_prefix_of_the_beams_best_gives_it_back_on_a_trained_model(toy_translators):
    # Beam search is not exact: forced into one first token, it explores more of that token's
    # subtree and may find a better hypothesis than the free search did (it does on an
    # untrained model's flat distributions). A trained model's are peaked: same hypothesis.
    translator = toy_translators[4]  # run_engine(tiny_run, beam_size=4, precision="float32")
    sentences = ["A man is sleeping .", "Two dogs play in the snow .", "A woman reads a book ."]
    encoded = translator.encode(sentences)
    src = np.zeros((3, max(map(len, encoded))), np.int32)
    for row, ids in enumerate(encoded):
        src[row, : len(ids)] = ids
    free = translator.search_ids(src)
    best = np.asarray(free["ids"])[:, 0]
    for k in (1, 2, 3):
        forced = translator.search_ids(src, prefix_of(best, k))
        assert hypotheses(np.asarray(forced["ids"])[:, 0]) == hypotheses(best)
        np.testing.assert_allclose(forced["scores"][:, 0], free["scores"][:, 0], atol=1e-4)


@pytest.mark.slow
def test_outputs_start_with_their_prefix_and_its_score_counts(model, scorer):
    src = sources(seed=5)
    prefix = np.array([[7, 8, 9, 10, 11], [12, 0, 0, 0, 0], [0, 0, 0, 0, 0]], np.int32)
    result = compiled_beam_search(model, 3, 0.0, with_prefix=True)(src, prefix)
    filled = np.asarray(result["scores"]) > NEG_INF / 2  # a pool may stop with fewer than 3
    assert filled[:, 0].all()
    for row, wanted in enumerate([[7, 8, 9, 10, 11], [12], []]):
        for k in np.flatnonzero(filled[row]):
            assert list(np.asarray(result["ids"])[row, k, : len(wanted)]) == wanted
    # The score counts the forced tokens: equal to scoring the hypothesis as a given target.
    best = np.asarray(result["ids"])[:, 0]
    scored = scorer(src, best)
    np.testing.assert_allclose(scored["log_prob"], result["log_probs"][:, 0], atol=1e-4)


@pytest.mark.slow
def test_the_beams_best_scores_as_its_search_score_without_length_penalty(model, scorer):
    src = sources(seed=6)
    result = compiled_beam_search(model, 4, 1.0)(src)
    for k in range(4):
        ids = np.asarray(result["ids"])[:, k]
        scored = scorer(src, ids)
        np.testing.assert_allclose(scored["log_prob"], result["log_probs"][:, k], atol=1e-4)
        lengths = [len(h) for h in hypotheses(ids)]
        np.testing.assert_array_equal(scored["tokens"], lengths)


def test_sampling_with_top_k_1_equals_greedy(model, greedy):
    src = sources(seed=7)
    greedy_ids, greedy_scores = greedy(src)
    sampled = compiled_sample_search(model, num_samples=3, top_k=1)(src, np.int32(5))
    for j in range(3):
        assert hypotheses(sampled["ids"][:, j]) == hypotheses(greedy_ids)
        np.testing.assert_allclose(sampled["scores"][:, j], greedy_scores, atol=1e-5)


@pytest.mark.slow
def test_the_same_seed_gives_the_same_samples_and_another_seed_others(model, scorer):
    src = sources(seed=8)
    sample = compiled_sample_search(model, num_samples=4, temperature=1.5)
    first, again, other = sample(src, np.int32(1)), sample(src, np.int32(1)), sample(
        src, np.int32(2))
    np.testing.assert_array_equal(first["ids"], again["ids"])
    assert not np.array_equal(np.asarray(first["ids"]), np.asarray(other["ids"]))
    # Scores are the model's log-probabilities of what was drawn.
    for j in range(4):
        ids = np.asarray(first["ids"])[:, j]
        np.testing.assert_allclose(scorer(src, ids)["log_prob"],
                                   first["scores"][:, j], atol=1e-4)


def test_top_k_and_top_p_keep_only_the_allowed_tokens():
    log_probs = tf.math.log(tf.constant([[0.5, 0.3, 0.15, 0.05]] * 400))
    for sampler, allowed in [(RandomSampler(top_k=2), {0, 1}),
                             (RandomSampler(top_p=0.7), {0, 1}),
                             (RandomSampler(top_p=0.85), {0, 1, 2}),
                             # A temperature below 1 sharpens before the nucleus cut.
                             (RandomSampler(top_p=0.85, temperature=0.5), {0, 1}),
                             (RandomSampler(top_k=tf.constant(3)), {0, 1, 2}),
                             (RandomSampler(top_p=tf.constant(0.4)), {0})]:
        drawn = set(np.asarray(sampler(log_probs, tf.constant(0))).tolist())
        assert drawn == allowed, (sampler.__dict__, drawn)


@pytest.mark.slow
def test_translator_prefixes_samples_and_scores(toy_translators):
    # tiny_run's engines, shared with the other tests of the worker (alpha 0.6: the default)
    translator = toy_translators[2]  # run_engine(tiny_run, beam_size=2, precision="float32")
    sentences = ["A man is sleeping .", "", "Two dogs play in the snow ."]
    free = translator.translate(sentences)
    best = translator.translate(sentences, nbest=True)
    assert [hyps[0][0] for hyps in best] == free
    first_words = [text.split()[0] if text else "" for text in free]
    assert translator.translate(sentences, prefixes=first_words) == free
    forced = translator.translate(sentences, prefixes=["Zwei Katzen", "", ""])
    assert forced[0].startswith("Zwei Katzen")
    assert forced[1:] == free[1:]
    greedy = toy_translators[1]
    samples = greedy.sample(sentences, num_samples=3, top_k=1, seed=3)
    assert [[text for text, _ in hyps] for hyps in samples] == [[t] * 3 if t else [""]
                                                                 for t in greedy.translate(
                                                                     sentences)]
    again = translator.sample(sentences, num_samples=2, top_p=0.9, seed=9)
    assert again == translator.sample(sentences, num_samples=2, top_p=0.9, seed=9)
    scores = translator.score(sentences, free)
    for sentence, (text, score), scored in zip(sentences, [hyps[0] for hyps in best], scores):
        # The pieces and EOS: the score of a translation counts its end.
        assert scored["tokens"] == len(translator.encode_targets([text])[0]) + 1
        assert scored["mean"] == pytest.approx(scored["log_prob"] / scored["tokens"])
        if sentence:  # the search's score: the same log P, over the GNMT length penalty
            penalty = ((5 + scored["tokens"]) / 6) ** translator.alpha
            assert score == pytest.approx(scored["log_prob"] / penalty, abs=1e-3)
        else:  # an empty sentence is not searched
            assert (text, score) == ("", 0.0)
    with pytest.raises(InputError, match="top_p"):
        translator.sample(sentences, top_p=0.0)
    with pytest.raises(InputError, match="2 prefixes"):
        translator.translate(sentences, prefixes=["a", "b"])
