"""Shared source-target subword vocabulary: trained with sentencepiece (BPE), used through
tensorflow-text so the same object tokenizes in tf.data and inside exported graphs.

Normalization (documented deviation from a byte-exact round trip): no Unicode normalization is
applied; leading/trailing spaces are removed and runs of spaces collapse to one.
Characters never seen in training fall back to their UTF-8 bytes (`byte_fallback`), so for any
text `detokenize(tokenize(s)) == normalize_whitespace(s)`.
"""

import hashlib
import json
import logging
import os
import re
import pathlib
import tempfile
import time

import tensorflow as tf
import tensorflow_text as tf_text

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
            raise FileNotFoundError(f"Tokenizer model not found: {path}")
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


def _fingerprint(settings, files):
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for path in files:
        stat = os.stat(path)
        digest.update(f"{os.path.abspath(path)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def train_tokenizer(texts, output_dir, vocab_size=8000, model_type="bpe", sample_size=2_000_000,
                    source_files=(), progress=True, seed=0, user_symbols=()):
    """Trains (or reuses) a shared sentencepiece vocabulary.

    Args:
        texts: an iterable of training sentences (source and target sides together).
        output_dir: where `spm.model` and `spm.json` (the settings) are written. A model
            trained with the same settings on the same `source_files` is reused.
        vocab_size: number of pieces (paper: 37000 en-de, 32000 en-fr; ~8000 for Multi30k).
        model_type: "bpe" (as the paper) or "unigram".
        sample_size: sentencepiece trains on at most this many sentences (random sample).
        source_files: files the texts come from; their names, sizes and times key the cache.
        progress: show a progress bar while collecting the text.
        user_symbols: space-separated tokens that must each be one piece (e.g. the tree
            tokens of parsing).

    Returns:
        a `SubwordTokenizer`.
    """
    import sentencepiece as spm
    from tqdm import tqdm

    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    model_path, info_path = output_dir / "spm.model", output_dir / "spm.json"
    settings = {"vocab_size": vocab_size, "model_type": model_type, "sample_size": sample_size,
                "seed": seed, "version": 1}
    if user_symbols:
        settings["user_symbols"] = list(user_symbols)
    key = _fingerprint(settings, source_files) if source_files else None
    if key and model_path.is_file() and info_path.is_file():
        if json.loads(info_path.read_text()).get("fingerprint") == key:
            log.info("Reusing vocabulary %s (same corpus and settings)", model_path)
            return SubwordTokenizer.load(model_path)

    start = time.time()
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
            raise ValueError("No text to train a vocabulary on: every sentence was empty.")
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
                input_sentence_size=sample_size, shuffle_input_sentence=True, seed_sentencepiece_size=1_000_000,
                num_threads=os.cpu_count() or 1, minloglevel=2,
                # With the word-boundary mark, so that " (NP" is one piece, not two.
                user_defined_symbols=["\u2581" + symbol for symbol in user_symbols],
            )
        except RuntimeError as error:
            raise ValueError(
                f"sentencepiece could not train vocab_size={vocab_size} on {count} sentences: "
                f"{str(error).split('] ')[-1]} (byte fallback needs 256 byte pieces + 4 "
                "specials + every character of the corpus; big vocabularies need enough text)."
            ) from None
        # Atomic: write beside the target, then rename.
        temporary = model_path.with_suffix(".model.tmp")
        temporary.write_bytes((prefix.with_suffix(".model")).read_bytes())
        os.replace(temporary, model_path)
    info = {**settings, "fingerprint": key, "sentences": count,
            "seconds": round(time.time() - start, 1)}
    tmp_info = info_path.with_suffix(".json.tmp")
    tmp_info.write_text(json.dumps(info, indent=2))
    os.replace(tmp_info, info_path)
    if progress:
        print(f"vocabulary: {model_path} ready in {info['seconds']} s", flush=True)
    return SubwordTokenizer.load(model_path)
