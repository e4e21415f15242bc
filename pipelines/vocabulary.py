"""The shared source-target subword vocabulary through sentencepiece's own Python API: training
it, and tokenizing with it where TensorFlow is not wanted (the JAX backend, the GPU machines).

`pipelines.tokenizer.SubwordTokenizer` wraps the same model file for tf.data and exported graphs
(tensorflow-text); both give the same ids for the same text.

Normalization (documented deviation from a byte-exact round trip): no Unicode normalization is
applied; leading/trailing spaces are removed and runs of spaces collapse to one.
Characters never seen in training fall back to their UTF-8 bytes (`byte_fallback`), so for any
text `decode(encode(s)) == normalize_whitespace(s)`.
"""

import logging
import os
import pathlib
import re
import tempfile
import time
import types


from pipelines.defaults import VOCAB_SIZE, VOCABULARY_SAMPLE
from pipelines.files import no_space, no_space_error
from pipelines.errors import DataError
from pipelines.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

log = logging.getLogger(__name__)

FILENAME = "spm.model"  # what the model file is called wherever it is kept


def normalize_whitespace(text):
    """The only normalization the tokenizer applies: ASCII spaces stripped at both ends and
    runs of them collapsed to one. Other characters (tabs, no-break spaces) are kept."""
    return re.sub(" +", " ", text.strip(" "))


def processor_of(model_proto):
    """A `sentencepiece.SentencePieceProcessor` of a model, checked for our special ids."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=bytes(model_proto))
    for expected, actual, what in ((PAD_ID, processor.pad_id(), "pad"),
                                   (BOS_ID, processor.bos_id(), "bos"),
                                   (EOS_ID, processor.eos_id(), "eos")):
        if expected != actual:
            raise ValueError(
                f"Sentencepiece model has {what}_id={actual}, expected {expected}: train it "
                "with `train_vocabulary` (or pad_id=0, bos_id=1, eos_id=2, unk_id=3).")
    return processor


class Vocabulary:
    """A sentencepiece model used from Python: `encode` strings, `decode` id rows.

    Args:
        model_proto: the serialized sentencepiece model (bytes).
    """

    FILENAME = FILENAME

    def __init__(self, model_proto):
        self.model_proto = bytes(model_proto)
        self.processor = processor_of(self.model_proto)
        self.vocab_size = self.processor.get_piece_size()

    @classmethod
    def load(cls, path):
        path = pathlib.Path(path)
        if not path.is_file():
            raise DataError(f"Tokenizer model not found: {path}")
        return cls(path.read_bytes())

    def encode(self, texts):
        """Strings -> lists of ids, without BOS/EOS."""
        return self.processor.encode(list(texts), num_threads=os.cpu_count() or 1)

    def decode(self, ids):
        """(N, T) ids (a numpy array or lists), cut at the first EOS, padding and BOS dropped
        -> N strings."""
        import numpy as np

        texts = []
        for row in np.asarray(ids).tolist() if not isinstance(ids, list) else ids:
            row = list(row)
            if EOS_ID in row:
                row = row[: row.index(EOS_ID)]
            texts.append(self.processor.decode([i for i in row if i not in (PAD_ID, BOS_ID)]))
        return texts

    def id_to_piece(self, ids):
        return [self.processor.id_to_piece(int(i)) for i in ids]

    def pieces(self):
        """Every piece, in id order (two vocabularies with the same pieces encode alike)."""
        return self.id_to_piece(range(self.vocab_size))


def tokenizer_settings(vocab_size=VOCAB_SIZE, model_type="bpe", sample_size=VOCABULARY_SAMPLE,
                       seed=0, user_symbols=()):
    """The settings that define a trained vocabulary (part of a prepared data cache's key)."""
    settings = {"vocab_size": vocab_size, "model_type": model_type, "sample_size": sample_size,
                "seed": seed, "version": 1}
    if user_symbols:
        settings["user_symbols"] = list(user_symbols)
    return settings


def train_vocabulary(texts, vocab_size=VOCAB_SIZE, model_type="bpe", sample_size=VOCABULARY_SAMPLE,
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
        a `Vocabulary`; `vocabulary.training` records the settings, the number of sentences
        and the seconds taken.
    """
    import sentencepiece as spm
    from pipelines.progress import progress_bar

    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size <= 0:
        raise DataError(f"vocab_size={vocab_size!r} must be a positive integer.")
    settings = tokenizer_settings(vocab_size, model_type, sample_size, seed, user_symbols)
    start = time.time()
    # sentencepiece trains from a file: the text goes to a private temporary folder.
    with tempfile.TemporaryDirectory() as tmp:
        corpus = pathlib.Path(tmp) / "corpus.txt"
        count = 0
        try:
            with open(corpus, "w", encoding="utf-8") as out:
                for text in progress_bar(texts, desc="vocabulary: reading text",
                                         unit=" sentences", disable=not progress,
                                         interval=1.0):
                    text = normalize_whitespace(text)
                    if text:
                        out.write(text + "\n")
                        count += 1
        except OSError as error:
            if no_space(error):  # the temporary folder (TMPDIR) is full
                raise no_space_error(corpus, error, temporary=True) from None
            raise
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
        vocabulary = Vocabulary(prefix.with_suffix(".model").read_bytes())
    vocabulary.training = types.SimpleNamespace(
        settings=settings, sentences=count, seconds=round(time.time() - start, 1))
    return vocabulary
