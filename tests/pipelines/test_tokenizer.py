import gzip

import pytest
import tensorflow as tf

from pipelines.special_ids import BOS_ID, EOS_ID, PAD_ID
from pipelines.tokenizer import SubwordTokenizer, normalize_whitespace, train_tokenizer


def read_lines(path):
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return handle.read().split("\n")[:-1]


@pytest.fixture(scope="module")
def multi30k_tokenizers(tmp_path_factory, shared_data):
    shared = shared_data / "multi30k"
    tokenizers = {}
    for pair in ("de", "fr"):
        files = [shared / "train.en.gz", shared / f"train.{pair}.gz"]
        texts = [line for path in files for line in read_lines(path)]
        tokenizers[pair] = train_tokenizer(texts, vocab_size=8000, progress=False)
    return tokenizers


@pytest.mark.parametrize("lang,pair", [("en", "de"), ("de", "de"), ("fr", "fr")])
def test_round_trip_on_every_multi30k_val_sentence(multi30k_tokenizers, shared_data, lang, pair):
    tokenizer = multi30k_tokenizers[pair]
    sentences = read_lines(shared_data / "multi30k" / f"val.{lang}.gz")
    assert len(sentences) == 1014
    ids = tokenizer.tokenize(tf.constant(sentences))
    back = [text.decode("utf-8") for text in tokenizer.detokenize(ids).numpy()]
    mismatches = [(s, b) for s, b in zip(sentences, back) if b != normalize_whitespace(s)]
    assert mismatches == []
    # Specials never come out of plain tokenization.
    flat = ids.flat_values.numpy()
    assert not {PAD_ID, BOS_ID, EOS_ID} & set(flat.tolist())


def test_unseen_characters_round_trip_and_tokenizer_survives_saved_model(tmp_path):
    texts = ["the cat sat on the mat", "a dog ran in the park"] * 40
    tokenizer = train_tokenizer(texts, 300, progress=False)
    sample = tf.constant(["the 猫 sat  on ✓ mat ", ""])
    expected = [normalize_whitespace(s.decode()) for s in sample.numpy()]
    assert [t.decode() for t in tokenizer.detokenize(tokenizer.tokenize(sample)).numpy()] == expected

    tf.saved_model.save(tokenizer, str(tmp_path / "saved"))
    restored = tf.saved_model.load(str(tmp_path / "saved"))
    ids = restored.tokenize(sample)
    assert ids.to_list() == tokenizer.tokenize(sample).to_list()
    assert [t.decode() for t in restored.detokenize(ids).numpy()] == expected


def test_detokenize_dense_stops_at_eos(tmp_path):
    tokenizer = train_tokenizer(["one two three", "four five six"] * 30, 300,
                                progress=False)
    ids = tokenizer.tokenize(tf.constant(["one two", "six"])).to_list()
    dense = [ids[0] + [EOS_ID] + ids[1] + [PAD_ID], ids[1] + [EOS_ID, PAD_ID, PAD_ID, PAD_ID]]
    width = max(map(len, dense))
    dense = [row + [PAD_ID] * (width - len(row)) for row in dense]
    assert [t.decode() for t in tokenizer.detokenize_dense(dense).numpy()] == ["one two", "six"]
    # The model bytes are the model file: written out, they load back as the same tokenizer.
    (tmp_path / SubwordTokenizer.FILENAME).write_bytes(tokenizer.model_proto)
    loaded = SubwordTokenizer.load(tmp_path / SubwordTokenizer.FILENAME)
    assert loaded.tokenize(tf.constant(["one two", "six"])).to_list() == ids


def test_tokenizer_survives_reseeding(tmp_path):
    # tensorflow-text's eager sentencepiece resource dies when the eager caches are cleared.
    tokenizer = train_tokenizer(["one two three", "four five six"] * 30, 300,
                                progress=False)
    before = tokenizer.tokenize(tf.constant(["two three"])).to_list()
    tf.random.set_seed(7)
    assert tokenizer.tokenize(tf.constant(["two three"])).to_list() == before


def test_python_vocabulary_gives_the_ids_and_texts_of_the_tensorflow_tokenizer():
    from pipelines.vocabulary import Vocabulary

    texts = ["the cat sat on the mat", "a dog ran in the park"] * 40
    tokenizer = train_tokenizer(texts, 300, progress=False)
    vocabulary = Vocabulary(tokenizer.model_proto)
    sample = ["the 猫 sat  on ✓ mat ", "a dog", ""]
    ids = vocabulary.encode(sample)
    assert ids == tokenizer.tokenize(tf.constant(sample)).to_list()
    padded = [row + [2, 0, 0][: 3] + [0] * (12 - len(row)) for row in ids]
    assert vocabulary.decode(padded) == [
        t.decode() for t in tokenizer.detokenize_dense(padded).numpy()]
    assert vocabulary.decode(padded) == [normalize_whitespace(s) for s in sample]
