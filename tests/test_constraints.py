"""Lexically constrained beam search (`decoding.search.constraints`): every phrase appears in
every output, per sentence, with prefixes and n-best, the same on every way the search runs;
and the text layer's `translate(..., constraints=...)`.

The models are untrained (tiny, a 40-token vocabulary) and the length limit short
(extra_length 12): such a model rarely chooses the phrases itself, so the search must place
them.
"""


import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer
from keras_transformer.decoding.engines.ctranslate2 import CTranslate2Translator
from keras_transformer.decoding.engines.translator import Translator
from keras_transformer.decoding.search.beam_search import compiled_beam_search, translate_beam
from keras_transformer.errors import InputError
from pipelines.special_ids import EOS_ID
from tests.search_helpers import source_rows, tiny_model
from pipelines.tokenizer import train_tokenizer

VOCAB = 40
EXTRA = 12

# Sentence 0: two phrases; sentence 1: one of three tokens; sentence 2: none (rows of zeros).
CONSTRAINTS = np.array([[[11, 12, 0], [30, 0, 0]],
                        [[5, 6, 7], [0, 0, 0]],
                        [[0, 0, 0], [0, 0, 0]]], np.int32)


@pytest.fixture(scope="module")
def model():
    # Two layers each side: the sentences and phrases below were chosen on this model's
    # outputs (a plain output of three tokens or more to draw phrases from, for one).
    return tiny_model(VOCAB, num_layers=2)


@pytest.fixture(scope="module")
def constrained(model):
    return compiled_beam_search(model, 4, extra_length=EXTRA, with_constraints=True)


@pytest.fixture(scope="module")
def plain(model):
    """The same search without constraints (traced once for the file)."""
    return compiled_beam_search(model, 4, extra_length=EXTRA)


def sources(rows=3, width=7):
    return source_rows(VOCAB, 0, rows, width)


def tokens(ids):
    """A row of ids up to EOS (excluded), as a list."""
    row = [int(t) for t in np.asarray(ids)]
    return row[: row.index(EOS_ID)] if EOS_ID in row else row


def contains(hypothesis, phrase):
    phrase = [int(t) for t in phrase if t]
    return any(hypothesis[i: i + len(phrase)] == phrase
               for i in range(len(hypothesis) - len(phrase) + 1))


def assert_phrases_in_every_hypothesis(ids, constraints, scores=None):
    """Every hypothesis of each row holds its phrases; with `scores`, those of the places the
    pool filled (the others are empty, NEG_INF: a constrained output's limit, the plain
    output's length and its phrases', may leave room for fewer than the beam), the best
    always."""
    for row, phrases in enumerate(constraints):
        for k in range(ids.shape[1]):
            if scores is not None and k and scores[row, k] < -1e8:
                continue
            hypothesis = tokens(ids[row, k])
            for phrase in phrases:
                assert contains(hypothesis, phrase), (row, k, hypothesis, phrase)


def test_every_phrase_appears_in_every_hypothesis_of_its_sentence(constrained, plain):
    result = constrained(sources(), CONSTRAINTS)
    ids = np.asarray(result["ids"])
    assert ids.shape[:2] == (3, 4)
    scores = np.asarray(result["scores"])
    assert_phrases_in_every_hypothesis(ids, CONSTRAINTS, scores)
    assert np.all(scores[:, :-1] >= scores[:, 1:])  # best first
    # Without constraints the untrained model chooses none of the phrases.
    plain_ids = np.asarray(plain(sources())["ids"])
    assert not contains(tokens(plain_ids[1, 0]), CONSTRAINTS[1, 0])


def test_an_unconstrained_sentence_in_a_constrained_batch_is_searched_as_without(plain,
                                                                                  constrained):
    src = sources()
    found = constrained(src, CONSTRAINTS)
    plain = plain(src)  # the same batch
    # Each batch's ids are trimmed to its own longest hypothesis: compare the sentence's own.
    width = max(len(tokens(h)) + 1 for h in np.asarray(plain["ids"])[2])
    expected = np.asarray(plain["ids"])[2, :, :width]
    np.testing.assert_array_equal(np.asarray(found["ids"])[2, :, :width], expected)
    assert not np.asarray(found["ids"])[2, :, width:].any()
    for key in ("scores", "log_probs"):
        np.testing.assert_array_equal(np.asarray(found[key])[2], np.asarray(plain[key])[2])


def test_a_plain_output_that_holds_the_phrases_is_returned_as_it_is(plain, constrained):
    """Where the search without constraints already finds an output with every phrase, the
    constrained search returns it, with its score (issue 70: it used to return another, of a
    lower score, the banks having split the beam)."""
    src = sources(4)
    plain = plain(src)
    best = [tokens(h) for h in np.asarray(plain["ids"])[:, 0]]
    assert all(len(hypothesis) >= 3 for hypothesis in best)
    phrases = np.zeros((4, 2, 2), np.int32)
    for row, hypothesis in enumerate(best[:3]):  # a token and a pair of the plain output
        phrases[row, 0, 0], phrases[row, 1] = hypothesis[-1], hypothesis[:2]
    phrases[3, 0] = [5, 6] if not contains(best[3], [5, 6]) else [6, 5]  # one it lacks
    found = constrained(src, phrases)
    ids, scores = np.asarray(found["ids"]), np.asarray(found["scores"])
    for row in range(3):
        assert tokens(ids[row, 0]) == best[row]
        np.testing.assert_allclose(scores[row, 0], np.asarray(plain["scores"])[row, 0],
                                   rtol=1e-6)
    assert contains(tokens(ids[3, 0]), phrases[3, 0])


def test_the_output_limit_leaves_room_for_the_phrases(constrained):
    ids = np.asarray(constrained(sources(), CONSTRAINTS)["ids"])
    # Sentence 0: 7 source tokens + 12 + its 3 phrase tokens, EOS included.
    assert max(len(tokens(h)) + 1 for h in ids[0]) <= 7 + EXTRA + 3


def test_prefix_and_constraints_together(model):
    search = compiled_beam_search(model, 4, extra_length=EXTRA, with_constraints=True,
                                  with_prefix=True)
    prefix = np.array([[5, 6, 0], [9, 0, 0], [0, 0, 0]], np.int32)
    result = search(sources(), CONSTRAINTS, prefix)
    ids, scores = np.asarray(result["ids"]), np.asarray(result["scores"])
    assert_phrases_in_every_hypothesis(ids, CONSTRAINTS, scores)
    for row in range(3):
        wanted = [int(t) for t in prefix[row] if t]
        assert all(tokens(h)[: len(wanted)] == wanted
                   for h, score in zip(ids[row], scores[row]) if score > -1e8)


@pytest.mark.slow  # a third constrained search traced (9 CPU-s)
def test_n_best_keeps_num_hypotheses_each_with_every_phrase(model):
    @tf.function
    def search(source_ids, constraints):
        return translate_beam(model, source_ids, 4, 0.6, num_hypotheses=2,
                              extra_length=EXTRA, constraints=constraints)

    result = search(sources(), CONSTRAINTS)
    assert result["ids"].shape[:2] == (3, 2) and result["scores"].shape == (3, 2)
    assert_phrases_in_every_hypothesis(result["ids"].numpy(), CONSTRAINTS,
                                       result["scores"].numpy())


def test_a_beam_of_1_is_refused(model):
    with pytest.raises(InputError, match="constraints need beam search: use a beam of 2 or"):
        translate_beam(model, sources(), 1, constraints=CONSTRAINTS)
    with pytest.raises(InputError, match="constraints need beam search"):
        compiled_beam_search(model, 1, with_constraints=True)


@pytest.mark.slow  # eager decoding and an XLA compilation
# The same search under JAX: tests/test_search_jax.py (one JAX child for every mode).
def test_eager_graph_and_xla_find_the_same(model, constrained):
    src = sources()
    expected = constrained(src, CONSTRAINTS)
    eager = translate_beam(model, tf.constant(src), 4, 0.6, extra_length=EXTRA,
                           constraints=tf.constant(CONSTRAINTS))
    xla = compiled_beam_search(model, 4, extra_length=EXTRA, with_constraints=True,
                               jit_compile=True)(np.pad(src, [[0, 0], [0, 9]]),
                                                 np.pad(CONSTRAINTS, [[0, 0], [0, 2], [0, 1]]))
    for found in (eager, xla):
        np.testing.assert_array_equal(np.asarray(found["ids"]), np.asarray(expected["ids"]))
        np.testing.assert_allclose(np.asarray(found["scores"]), np.asarray(expected["scores"]),
                                   rtol=1e-4, atol=1e-4)


# -- the text layer ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def translator():
    texts = ["a dog runs in the park", "the red cat sleeps on the big tree"] * 30
    tokenizer = train_tokenizer(texts, 300, progress=False)
    tf.keras.utils.set_random_seed(3)
    model = Transformer.from_preset("tiny", vocab_size=tokenizer.vocab_size, dropout=0.0,
                                    num_layers=1)
    model.build()
    return Translator(model, tokenizer, beam_size=4, max_input_length=12, batch_size=4,
                      extra_length=EXTRA, precision="float32")


SENTENCES = ["a dog runs", "the cat sleeps", "the big tree", ""]
PHRASES = [["red cat", "park"], [], ["dog"], ["tree"]]


def test_translate_puts_every_phrase_in_every_translation(translator):
    found = translator.translate(SENTENCES, constraints=PHRASES)
    assert found[3] == ""  # an empty line is not searched
    for text, phrases in zip(found[:3], PHRASES):
        assert all(phrase in text for phrase in phrases), (text, phrases)
    # The sentence without phrases, batched with the others, translates as without any.
    assert found[1] == translator.translate(SENTENCES)[1]
    nbest = translator.translate(SENTENCES[:1], nbest=True, constraints=PHRASES[:1])[0]
    assert 1 <= len(nbest) <= 4 and all("red cat" in t and "park" in t for t, _ in nbest)


def test_translate_with_alignments_and_prefixes(translator):
    found = translator.translate(SENTENCES[:2], alignments=True, constraints=PHRASES[:2],
                                 prefixes=["the", ""])
    (first, links), _ = found
    assert first.startswith("the") and "red cat" in first and "park" in first
    assert isinstance(links, str)


def test_bad_constraints_are_refused_by_sentence(translator):
    with pytest.raises(InputError, match="sentence 1 hold an empty phrase"):
        translator.translate(["a dog", "a cat"], constraints=[["dog"], ["  "]])
    with pytest.raises(InputError, match="one list of phrases per sentence"):
        translator.translate(["a dog", "a cat"], constraints=[["dog"]])
    with pytest.raises(InputError, match="sentence 0 must be a list of strings"):
        translator.translate(["a dog"], constraints=["dog"])
    greedy = Translator(translator.model, translator.vocabulary, beam_size=1)
    with pytest.raises(InputError, match="constraints need beam search"):
        greedy.translate(["a dog"], constraints=[["dog"]])


def test_ctranslate2_refuses_constraints_naming_the_tensorflow_engine():
    with pytest.raises(InputError, match="ctranslate2 engine does not support constraints.*"
                                         "tensorflow engine does"):
        CTranslate2Translator.refuse_unsupported(["constraints"])
