"""Word alignments: the Pharaoh format, AER, pieces gathered into words, the graph's strings
equal to Python's, and, on a model trained on the digit corpus (one target word per source
word, in order), AER <= 0.1 against the diagonal with the chosen layer and heads, from our
engine and from CTranslate2; the same alignments from `Translator`, the SavedModel (loaded in
a fresh process) and, within the documented tolerance, the CTranslate2 engine."""

import pathlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer
from keras_transformer.decoding.search import alignment
from keras_transformer.decoding.search.alignment import (
    align_ids, align_texts, alignment_error_rate, cross_attention, ctranslate2_pharaoh,
    format_pharaoh, parse_pharaoh, pharaoh_graph, pharaoh_lines, read_pharaoh,
    starts_word_table, word_links)
from keras_transformer.errors import InputError
from keras_transformer.models import Ensemble
from pipelines.special_ids import EOS_ID, PAD_ID

W = "\u2581"
# A hand-made vocabulary: ids 0-3 special, then pieces that start words or continue them.
PIECES = ["<pad>", "<s>", "</s>", "<unk>", W + "a", "b", W + "c", "d", W, "e"]
A, B, C, D, SPACE, E = 4, 5, 6, 7, 8, 9


# -- Pharaoh format and AER -------------------------------------------------------------------

def test_pharaoh_lines_parse_into_sure_and_possible_links(tmp_path):
    sure, possible = parse_pharaoh("0-0 2?1 1p1 3-2")
    assert sure == {(0, 0), (3, 2)}
    assert possible == {(0, 0), (2, 1), (1, 1), (3, 2)}  # possible includes sure
    assert parse_pharaoh("") == (set(), set())  # an empty line: no links
    assert format_pharaoh({(3, 2), (0, 0), (1, 2)}) == "0-0 1-2 3-2"
    assert parse_pharaoh(format_pharaoh({(3, 2), (0, 0)}))[0] == {(3, 2), (0, 0)}
    gold = tmp_path / "gold.txt"
    gold.write_text("0-0 1-1\n\n0?1\n", encoding="utf-8")
    assert read_pharaoh(gold) == [({(0, 0), (1, 1)}, {(0, 0), (1, 1)}), (set(), set()),
                                  (set(), {(0, 1)})]
    gold.write_text("0-0\n1-x\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"gold.txt, line 2: '1-x' is not a Pharaoh link"):
        read_pharaoh(gold)
    with pytest.raises(InputError, match="alignment file not found"):
        read_pharaoh(tmp_path / "missing.txt")


def test_alignment_error_rate_counts_sure_and_possible_links():
    # AER = 1 - (|A & S| + |A & P|) / (|A| + |S|), summed over sentences.
    assert alignment_error_rate(["0-0 1-1"], ["0-0 1-1"]) == 0.0
    assert alignment_error_rate(["0-1"], ["0-0"]) == 1.0
    # A possible link predicted costs nothing; a sure one missed does.
    assert alignment_error_rate(["0-0 1-1"], ["0-0 1?1"]) == 0.0
    assert alignment_error_rate(["0-0"], ["0-0 1-1"]) == pytest.approx(1 - 2 / 3)
    # Corpus level: (1 + 2 + 0 + 0) / (2 + 2 + 1 + 1) over two sentences.
    assert alignment_error_rate(["0-0 1-2", "0-1"], ["0-0 1-1 1?2", "0-0"]) == pytest.approx(
        1 - 3 / 6)
    assert alignment_error_rate([{(0, 0)}, ""], [({(0, 0)}, set()), ""]) == 0.0
    with pytest.raises(InputError, match="2 predicted alignments for 1 gold"):
        alignment_error_rate(["", ""], [""])


# -- Pieces into words ------------------------------------------------------------------------

def test_words_start_at_word_boundary_pieces_and_specials_belong_to_none():
    table = starts_word_table(PIECES)
    assert table.tolist() == [False, False, False, False, True, False, True, False, True,
                              False]
    ids = np.array([[A, B, C, EOS_ID, PAD_ID], [B, SPACE, E, A, EOS_ID]], np.int32)
    index, words = alignment.word_index(ids, table)
    # Row 2: a first piece without the mark still starts the first word; "\u2581" + "e" is
    # one word ("\u2581" alone starts it).
    assert np.asarray(index).tolist() == [[0, 0, 1, -1, -1], [0, 1, 1, 2, -1]]
    assert np.asarray(words).tolist() == [2, 3]


def test_a_real_vocabulary_counts_the_words_of_the_text():
    from pipelines.vocabulary import train_vocabulary

    text = ["the unbelievable dog runs", "a cat, sleeping", "Übergrößenträger x", "3 1 4 1"]
    vocabulary = train_vocabulary(text * 5, vocab_size=300, progress=False)
    table = starts_word_table(vocabulary.pieces())
    rows = [ids + [EOS_ID] for ids in vocabulary.encode(text)]
    assert any(len(ids) > len(t.split()) + 1 for ids, t in zip(rows, text))  # multi-piece words
    _, words = alignment.word_index(alignment.padded(rows), table)
    assert np.asarray(words).tolist() == [len(t.split()) for t in text]
    # Texts in, one Pharaoh line per pair out: a link per target word; empty sides give "".
    keras.utils.set_random_seed(3)
    model = Transformer(vocab_size=vocabulary.vocab_size, num_layers=1, d_model=16,
                        num_heads=2, d_ff=32)
    found = align_texts(model, vocabulary, text + ["", "a cat"], text[::-1] + ["dog", ""])
    for line, target in zip(found, text[::-1]):
        sure, _ = parse_pharaoh(line)
        assert sorted(t for _, t in sure) == list(range(len(target.split())))
    assert found[-2:] == ["", ""]
    with pytest.raises(InputError, match="2 sources and 1 targets"):
        align_texts(model, vocabulary, ["a", "b"], ["c"])


def test_word_links_sum_a_words_pieces_and_pick_the_best_source_word():
    table = starts_word_table(PIECES)
    # Source words: [a b] [c] EOS; target words: [c d] [a] EOS PAD.
    source = np.array([[A, B, C, EOS_ID]], np.int32)
    target = np.array([[C, D, A, EOS_ID, PAD_ID]], np.int32)
    attention = np.array([[[0.2, 0.2, 0.3, 0.3],    # "c": source word 0 gets 0.4, word 1 0.3
                           [0.0, 0.1, 0.5, 0.4],    # "d": word 1 0.5; summed: 0.5 vs 0.8
                           [0.3, 0.0, 0.2, 0.5],    # "a": word 0 (EOS's 0.5 does not count)
                           [0.0, 0.0, 0.0, 1.0],    # EOS: no word
                           [0.25, 0.25, 0.25, 0.25]]], np.float32)
    found = word_links(attention, source, target, table)
    assert np.asarray(found["links"]).tolist() == [[1, 0, -1, -1, -1]]
    assert pharaoh_lines(found) == ["1-0 0-1"]
    # Ties go to the first source word; no source word: no link.
    even = np.full((1, 5, 4), 0.25, np.float32)
    assert pharaoh_lines(word_links(even, source, target, table)) == ["0-0 0-1"]
    empty = np.array([[EOS_ID, PAD_ID, PAD_ID, PAD_ID]], np.int32)
    assert pharaoh_lines(word_links(even, empty, target, table)) == [""]
    # CTranslate2's rows (no EOS row or column) give the same string.
    pieces = [PIECES[i] for i in (A, B, C)], [PIECES[i] for i in (C, D, A)]
    assert ctranslate2_pharaoh(*pieces, attention[0, :3, :3]) == "1-0 0-1"


def tiny_model(seed):
    keras.utils.set_random_seed(seed)
    model = Transformer(vocab_size=len(PIECES), num_layers=2, d_model=16, num_heads=2, d_ff=32,
                        dropout=0.0)
    model.build()
    return model


def random_pairs():
    """Id rows with padding, EOS and an empty sentence (row 4), for the tiny model."""
    rng = np.random.RandomState(0)
    source = rng.randint(3, len(PIECES), (6, 7)).astype(np.int32)
    target = rng.randint(3, len(PIECES), (6, 5)).astype(np.int32)
    source[:, -1], target[:, -1] = EOS_ID, EOS_ID
    source[2, 3:], target[3, 2:] = PAD_ID, PAD_ID  # padded rows
    source[2, 2] = target[3, 1] = EOS_ID
    source[4, 0], target[4, 0] = EOS_ID, EOS_ID  # empty source and target
    source[4, 1:], target[4, 1:] = PAD_ID, PAD_ID
    return source, target


IDS = tf.TensorSpec([None, None], tf.int32)


def test_the_graph_gives_the_strings_python_gives():
    model, table = tiny_model(1), starts_word_table(PIECES)
    source, target = random_pairs()
    attention = np.asarray(cross_attention(model, source, target))
    expected = pharaoh_lines(word_links(attention, source, target, table))
    assert expected[4] == "" and all(expected[i] for i in (0, 1, 2, 3, 5))

    @tf.function(input_signature=[tf.TensorSpec([None, None, None], tf.float32), IDS, IDS])
    def alignments(weights, source_ids, target_ids):
        return pharaoh_graph(word_links(weights, source_ids, target_ids, table))

    assert [s.decode() for s in alignments(attention, source, target).numpy()] == expected


@pytest.mark.slow  # tracing the model into a graph takes seconds
def test_the_whole_alignment_runs_in_a_graph():
    model, table = tiny_model(1), starts_word_table(PIECES)
    source, target = random_pairs()

    @tf.function(input_signature=[IDS, IDS])
    def alignments(source_ids, target_ids):
        return pharaoh_graph(align_ids(model, source_ids, target_ids, table))

    expected = pharaoh_lines(align_ids(model, source, target, table))
    assert [s.decode() for s in alignments(source, target).numpy()] == expected


def test_an_ensemble_aligns_with_its_members_mean_attention():
    members = [tiny_model(1), tiny_model(2)]
    source = np.array([[A, B, C, EOS_ID]], np.int32)
    target = np.array([[C, A, EOS_ID]], np.int32)
    mean = np.mean([np.asarray(cross_attention(m, source, target)) for m in members], axis=0)
    np.testing.assert_allclose(cross_attention(Ensemble(members), source, target), mean,
                               atol=1e-6)
    assert mean.shape == (1, 3, 4)
    np.testing.assert_allclose(mean.sum(-1), 1.0, atol=1e-5)  # rows are distributions
    # Layer and heads: counted from the last layer, the first N heads; others refused.
    first_head = cross_attention(members[0], source, target, layer=0, heads=1)
    assert first_head.shape == (1, 3, 4)
    with pytest.raises(InputError, match="alignment layer=2 is out of range for a decoder "
                                         "of 2 layers"):
        cross_attention(members[0], source, target, layer=2)
    with pytest.raises(InputError, match="alignment heads=3 must be 1..2"):
        cross_attention(members[0], source, target, heads=3)


# -- The digit corpus: the measured choice ----------------------------------------------------

NAMES = "null eins zwei drei vier fünf sechs sieben acht neun".split()


def number_names(sentence):
    return " ".join(NAMES[int(word)] for word in sentence.split())


@pytest.fixture(scope="module")
def digit_run(tmp_path_factory, runtime_preset):
    """The tiny preset trained on digits -> number names until it translates held-out
    sentences exactly (900 steps: 38 of the 40 dev sentences exact, as after 1200; 600 steps
    gave about half; under a minute on 2 loaded cores)."""
    from tests.conftest import toy_config
    from tests.training_helpers import write_corpus
    from keras_transformer.training import train

    folder = tmp_path_factory.mktemp("digits")
    corpus = write_corpus(folder / "corpus", pairs=440, words=[str(d) for d in range(10)],
                          target=number_names)
    keras.utils.set_random_seed(1234)
    train(toy_config(corpus, folder / "run", train_steps=900, warmup_steps=100,
                     checkpoint_steps=900, eval_steps=900, dropout=0.0, vocab_size=370,
                     tokens_per_batch=1024, num_layers=2))  # two layers to choose from
    seen = set(corpus["train.src"].read_text(encoding="utf-8").splitlines())
    held_out = [s for s in corpus["dev.src"].read_text(encoding="utf-8").splitlines()
                if s not in seen]
    return folder / "run", held_out


@pytest.fixture(scope="module")
def digit_model(digit_run):
    """(run, model, vocabulary) of digit_run, loaded once."""
    from keras_transformer.runs import Run

    run = Run(digit_run[0])
    return run, run.load_model(), run.vocabulary()


@pytest.fixture(scope="module")
def digit_greedy(digit_model):
    """The greedy Translator of the digit model (its search compiled once)."""
    from keras_transformer.decoding.engines.translator import Translator

    _, model, vocabulary = digit_model
    return Translator(model, vocabulary, beam_size=1, precision="float32")


@pytest.fixture(scope="module")
def digit_ct2(digit_model, tmp_path_factory):
    """The digit model exported for CTranslate2 (the alignment layer and heads chosen)."""
    from keras_transformer.export.ct2 import export_ctranslate2

    run, model, _ = digit_model
    return export_ctranslate2(model, run.tokenizer(), tmp_path_factory.mktemp("digit") / "ct2",
                              max_input_length=run.config.max_length)


def diagonal(sentence):
    return " ".join(f"{i}-{i}" for i in range(len(sentence.split())))


@pytest.mark.slow
def test_digit_alignments_are_the_diagonal(digit_run, digit_model, digit_greedy, request):
    _, sources = digit_run
    _, model, vocabulary = digit_model
    translations = digit_greedy.translate(sources)
    exact = sum(t == number_names(s) for s, t in zip(sources, translations))
    assert exact >= 0.8 * len(sources), list(zip(sources, translations))
    gold = [diagonal(s) for s in sources]
    by_layer = {layer: alignment_error_rate(align_texts(model, vocabulary, sources,
                                                        translations, layer=layer), gold)
                for layer in range(model.architecture["num_layers"])}
    chosen = align_texts(model, vocabulary, sources, translations)
    aer = alignment_error_rate(chosen, gold)
    print(f"digit corpus: {exact}/{len(sources)} exact; AER by layer (heads averaged) "
          f"{by_layer}; chosen (layer {alignment.ALIGNMENT_LAYER}, heads "
          f"{alignment.ALIGNMENT_HEADS or 'all'}): {aer:.3f}")
    assert aer <= 0.1
    assert aer <= min(by_layer.values()) + 1e-9  # the choice is the best layer here

    # CTranslate2, exported with the same layer and heads, links the same words.
    pytest.importorskip("ctranslate2")
    from keras_transformer.decoding.engines.ctranslate2 import CTranslate2Translator

    theirs = CTranslate2Translator(request.getfixturevalue("digit_ct2"), beam_size=1)
    pieces = theirs.encode(sources)
    outputs = theirs.translator.translate_batch(pieces, beam_size=1, return_attention=True,
                                                max_input_length=0)
    same = total = 0
    for source, output, ours, translation in zip(pieces, outputs, chosen, translations):
        hypothesis = output.hypotheses[0]
        assert theirs.processor.decode(hypothesis) == translation  # the same greedy output
        found = ctranslate2_pharaoh(source, hypothesis, output.attention[0]).split()
        same += sum(a == b for a, b in zip(found, ours.split()))
        total += len(ours.split())
    print(f"CTranslate2: {same} of {total} target words linked as ours")
    assert same >= 0.95 * total, (same, total)


def linked_alike(ours, theirs):
    """(target words linked to the same source word, target words) over Pharaoh lines."""
    same = sum(a == b for x, y in zip(ours, theirs) for a, b in zip(x.split(), y.split()))
    return same, sum(len(x.split()) for x in ours)


@pytest.mark.slow
def test_translator_saved_model_and_ctranslate2_give_the_same_alignments(
        digit_run, digit_model, digit_greedy, tmp_path, request):
    import json
    import os
    import subprocess
    import sys

    from keras_transformer.decoding.engines.translator import Translator
    from keras_transformer.export import export_saved_model
    from tests.test_serving import FRESH_PROCESS

    _, held_out = digit_run
    run, model, vocabulary = digit_model
    sources = held_out[:12] + ["", "3 1 4"]
    ours = Translator(model, vocabulary, beam_size=2, alpha=0.6, precision="float32")
    best = ours.translate(sources, alignments=True)
    nbest = ours.translate(sources, nbest=True, alignments=True)
    assert [pair for pair in best] == [(h[0][0], h[0][2]) for h in nbest]
    assert best[-2] == ("", "") and nbest[-2] == [("", 0.0, "")]
    assert alignment_error_rate([a for _, a in best[:-2]],
                                [diagonal(s) for s in sources[:-2]]) <= 0.1
    # Teacher-forced on the search's own output: the search's alignment.
    scored = ours.score(sources, [text for text, _ in best], alignments=True)
    assert [s["alignment"] for s in scored] == [a for _, a in best]

    # The SavedModel, exported with alignments, loaded in a fresh process.
    path = export_saved_model(model, run.tokenizer(), tmp_path / "saved", beam_size=2,
                              alpha=0.6, max_input_length=run.config.max_length,
                              alignments=True)
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel.FromString((path / "saved_model.pb").read_bytes())
    outputs = {name: sorted(signature.outputs)
               for name, signature in proto.meta_graphs[0].signature_def.items()}
    assert outputs["serving_default"] == outputs["translate_nbest"] == [
        "alignments", "scores", "translations"]
    assert "alignments" not in outputs["sample"] + outputs["translate_ids"]
    requests = tmp_path / "requests.py"
    off = dict(prefixes=[], constraints=[], no_repeat_ngram_size=0, repetition_penalty=1.0)
    requests.write_text(repr([
        ("serving_default", dict(sentences=sources, beam_size=2, alpha=0.6, **off)),
        ("translate_nbest", dict(sentences=sources, beam_size=2, alpha=0.6, num_hypotheses=2,
                                 **off)),
        ("serving_default", dict(sentences=[], beam_size=2, alpha=0.6, **off)),
        ("translate_nbest", dict(sentences=[], beam_size=2, alpha=0.6, num_hypotheses=2,
                                 **off))]), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-c", FRESH_PROCESS, str(path), str(requests), str(tmp_path / "a.json")],
        capture_output=True, text=True, timeout=600, env={**os.environ,
                                                          "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-3000:]
    served, served_nbest, *no_sentences = json.loads((tmp_path / "a.json").read_text())[
        "answers"]
    assert [answer["alignments"] for answer in no_sentences] == [[], []]  # 0 in, 0 out
    assert list(zip(served["translations"], served["alignments"])) == best
    for row, hypotheses in enumerate(nbest):
        got = list(zip(served_nbest["translations"][row], served_nbest["alignments"][row]))
        assert got[: len(hypotheses)] == [(text, links) for text, _, links in hypotheses]

    # CTranslate2 (its greedy search, our rule on its attention): within the tolerance.
    pytest.importorskip("ctranslate2")
    from keras_transformer.decoding.engines.ctranslate2 import CTranslate2Translator

    folder = request.getfixturevalue("digit_ct2")
    theirs = CTranslate2Translator(folder, beam_size=1).translate(sources, alignments=True)
    greedy = digit_greedy.translate(sources, alignments=True)
    assert [text for text, _ in theirs] == [text for text, _ in greedy]
    same, total = linked_alike([a for _, a in greedy], [a for _, a in theirs])
    scored = CTranslate2Translator(folder).score(sources, [t for t, _ in best],
                                                 alignments=True)
    same_scored, _ = linked_alike([a for _, a in best], [s["alignment"] for s in scored])
    print(f"CTranslate2 engine: {same}/{total} target words linked as ours (search), "
          f"{same_scored}/{total} (score)")
    assert same >= 0.95 * total and same_scored >= 0.95 * total, (same, same_scored, total)
