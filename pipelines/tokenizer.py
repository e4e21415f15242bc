"""Shared source-target subword vocabulary: trained with sentencepiece (BPE), used through
tensorflow-text so the same object tokenizes in tf.data and inside exported graphs.

Normalization (documented deviation from a byte-exact round trip): no Unicode normalization is
applied; leading/trailing spaces are removed and runs of spaces collapse to one.
Characters never seen in training fall back to their UTF-8 bytes (`byte_fallback`), so for any
text `detokenize(tokenize(s)) == normalize_whitespace(s)`.
"""

import logging
import os
import re
import pathlib
import tempfile
import time
import types

import tensorflow as tf
import tensorflow_text as tf_text

from pipelines.errors import DataError
from pipelines.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

log = logging.getLogger(__name__)


def normalize_whitespace(text):
    """The only normalization the tokenizer applies: ASCII spaces stripped at both ends and
    runs of them collapsed to one. Other characters (tabs, no-break spaces) are kept."""
    return re.sub(" +", " ", text.strip(" "))


class SubwordTokenizer(tf.Module):
    """A sentencepiece model as a tf.Module: `tokenize` strings, `detokenize` ids.

    Args:
        model_proto: the serialized sentencepiece model (bytes).

    The methods are tf.functions with fixed signatures, so a SavedModel that holds this module
    tokenizes in-graph. The tensorflow-text op is created inside each traced function rather
    than once eagerly: tensorflow-text's sentencepiece resource is owned by an eager kernel and
    vanishes when `tf.random.set_seed` (or `keras.utils.set_random_seed`) clears the eager
    caches; a graph-owned one does not.
    """

    FILENAME = "spm.model"  # what the model file is called wherever it is kept

    def __init__(self, model_proto, name=None):
        import sentencepiece as spm

        super().__init__(name=name)
        self.model_proto = bytes(model_proto)
        processor = spm.SentencePieceProcessor(model_proto=self.model_proto)
        self.vocab_size = processor.get_piece_size()
        for expected, actual, what in ((PAD_ID, processor.pad_id(), "pad"),
                                       (BOS_ID, processor.bos_id(), "bos"),
                                       (EOS_ID, processor.eos_id(), "eos")):
            if expected != actual:
                raise ValueError(
                    f"Sentencepiece model has {what}_id={actual}, expected {expected}: train it "
                    "with `train_tokenizer` (or pad_id=0, bos_id=1, eos_id=2, unk_id=3)."
                )

    @classmethod
    def load(cls, path):
        path = pathlib.Path(path)
        if not path.is_file():
            raise DataError(f"Tokenizer model not found: {path}")
        return cls(path.read_bytes())

    def _op(self):
        return tf_text.SentencepieceTokenizer(model=self.model_proto, out_type=tf.int32)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def tokenize(self, texts):
        """(N,) strings -> ragged (N, None) int32 ids, without BOS/EOS."""
        return self._op().tokenize(texts)

    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int32)], autograph=False)
    def detokenize(self, ids):
        """Ragged (N, None) ids -> (N,) strings. PAD, BOS and EOS decode to nothing."""
        return self._op().detokenize(ids)

    def detokenize_dense(self, ids):
        """(N, T) ids, possibly padded, cut at the first EOS -> (N,) strings."""
        ids = tf.convert_to_tensor(ids, tf.int32)
        keep = tf.math.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32), axis=1, exclusive=True)
        ids = tf.where(keep > 0, PAD_ID, ids)
        return self.detokenize(tf.RaggedTensor.from_tensor(ids, padding=PAD_ID))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)], autograph=False)
    def id_to_piece(self, ids):
        """(N,) ids -> (N,) piece strings (for attention pictures and debugging)."""
        return self._op().id_to_string(ids)


def tokenizer_settings(vocab_size=8000, model_type="bpe", sample_size=2_000_000, seed=0,
                       user_symbols=()):
    """The settings that define a trained vocabulary (part of a prepared data cache's key)."""
    settings = {"vocab_size": vocab_size, "model_type": model_type, "sample_size": sample_size,
                "seed": seed, "version": 1}
    if user_symbols:
        settings["user_symbols"] = list(user_symbols)
    return settings


def train_tokenizer(texts, vocab_size=8000, model_type="bpe", sample_size=2_000_000,
                    progress=True, seed=0, user_symbols=()):
    """Trains a shared sentencepiece vocabulary in memory (nothing is written but a private
    temporary file for sentencepiece).

    Args:
        texts: an iterable of training sentences (source and target sides together).
        vocab_size: number of pieces (paper: 37000 en-de, 32000 en-fr; ~8000 for Multi30k).
        model_type: "bpe" (as the paper) or "unigram".
        sample_size: sentencepiece trains on at most this many sentences (random sample).
        progress: show a progress bar while collecting the text.
        seed: sentencepiece's sampling seed.
        user_symbols: space-separated tokens that must each be one piece (e.g. the tree
            tokens of parsing).

    Returns:
        a `SubwordTokenizer`; `tokenizer.training` records the settings, the number of sentences
        and the seconds taken. Its `model_proto` bytes are the model file's content: a run
        data folder keeps it (`pipelines.prepared.prepare`), so do a run and an export.
    """
    import sentencepiece as spm
    from tqdm import tqdm

    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size <= 0:
        raise DataError(f"vocab_size={vocab_size!r} must be a positive integer.")
    settings = tokenizer_settings(vocab_size, model_type, sample_size, seed, user_symbols)
    start = time.time()
    # sentencepiece trains from a file: the text goes to a private temporary folder.
    with tempfile.TemporaryDirectory() as tmp:
        corpus = pathlib.Path(tmp) / "corpus.txt"
        count = 0
        with open(corpus, "w", encoding="utf-8") as out:
            for text in tqdm(texts, desc="vocabulary: reading text", unit=" sentences",
                             disable=not progress, mininterval=1.0):
                text = normalize_whitespace(text)
                if text:
                    out.write(text + "\n")
                    count += 1
        if count == 0:
            raise DataError("No text to train a vocabulary on: every sentence was empty.")
        log.info("vocabulary: training %s with %d pieces on %d sentences (sentencepiece)",
                 model_type, vocab_size, count)
        if progress:
            print(f"vocabulary: training {model_type} ({vocab_size} pieces) on {count:,} "
                  "sentences with sentencepiece ...", flush=True)
        prefix = pathlib.Path(tmp) / "spm"
        try:
            spm.SentencePieceTrainer.train(
                input=str(corpus), model_prefix=str(prefix), vocab_size=vocab_size,
                model_type=model_type, character_coverage=1.0, byte_fallback=True,
                normalization_rule_name="identity", remove_extra_whitespaces=True,
                pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID,
                input_sentence_size=sample_size, shuffle_input_sentence=True,
                seed_sentencepiece_size=1_000_000, num_threads=os.cpu_count() or 1,
                minloglevel=2,
                # With the word-boundary mark, so that " (NP" is one piece, not two.
                user_defined_symbols=["\u2581" + symbol for symbol in user_symbols],
            )
        except RuntimeError as error:
            raise DataError(
                f"sentencepiece could not train vocab_size={vocab_size} on {count} sentences: "
                f"{str(error).split('] ')[-1]} (byte fallback needs 256 byte pieces + 4 "
                "specials + every character of the corpus; big vocabularies need enough text)."
            ) from None
        tokenizer = SubwordTokenizer(prefix.with_suffix(".model").read_bytes())
    # A namespace, not a dict: tf.Module would track a dict attribute as part of the module.
    tokenizer.training = types.SimpleNamespace(
        settings=settings, sentences=count, seconds=round(time.time() - start, 1))
    return tokenizer
