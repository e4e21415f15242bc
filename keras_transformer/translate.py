"""Translating text with a trained model: batching, tokenization, beam or greedy search.

    translator = Translator.from_run("runs/multi30k-en-de")     # averaged.keras if present
    translator.translate(["A dog runs in the park."])
"""

import json
import logging
import pathlib

import keras
import numpy as np
import tensorflow as tf

from keras_transformer.beam_search import compiled_beam_search
from keras_transformer.search import EXTRA_LENGTH, compiled_greedy_search
from pipelines.special_ids import EOS_ID
from pipelines.tokenizer import SubwordTokenizer, normalize_whitespace

log = logging.getLogger(__name__)


def load_run(run_dir, model_file=None):
    """(model, tokenizer, config dict) of a training run directory.

    The model is `model_file`, else RUN_DIR/averaged.keras if it exists, else RUN_DIR/model.keras.
    """
    run_dir = pathlib.Path(run_dir)
    if model_file is None:
        averaged = run_dir / "averaged.keras"
        model_file = averaged if averaged.is_file() else run_dir / "model.keras"
    model_file = pathlib.Path(model_file)
    for path in (model_file, run_dir / "vocab" / "spm.model"):
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: is {run_dir} a finished training run?")
    model = keras.models.load_model(model_file, compile=False)
    tokenizer = SubwordTokenizer.load(run_dir / "vocab" / "spm.model")
    config_path = run_dir / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    return model, tokenizer, config


class Translator:
    """Translates batches of sentences with beam search (or greedy search, beam_size=1).

    Args:
        model: a `Transformer`.
        tokenizer: the run's `SubwordTokenizer`.
        beam_size: 4 in the paper; 1 runs greedy search.
        alpha: length penalty (paper: 0.6).
        max_input_length: longer inputs (in subword tokens, EOS included) are truncated to
            this length with a warning naming the sentence. Default 256.
        batch_size: sentences per search call (sentences are sorted by length first).
        extra_length: maximum output length = input length + extra_length (paper: 50 for
            translation, 300 for parsing).
    """

    def __init__(self, model, tokenizer, beam_size=4, alpha=0.6, max_input_length=256,
                 batch_size=64, extra_length=EXTRA_LENGTH):
        if beam_size < 1:
            raise ValueError(f"beam_size={beam_size} must be at least 1.")
        self.model, self.tokenizer = model, tokenizer
        self.beam_size, self.alpha = beam_size, alpha
        self.max_input_length, self.batch_size = max_input_length, batch_size
        if beam_size == 1:
            greedy = compiled_greedy_search(model, extra_length=extra_length)
            self._search = lambda ids: _as_nbest(*greedy(ids))
        else:
            self._search = compiled_beam_search(model, beam_size, alpha,
                                                extra_length=extra_length)

    @classmethod
    def from_run(cls, run_dir, model_file=None, **kwargs):
        model, tokenizer, config = load_run(run_dir, model_file)
        kwargs.setdefault("max_input_length", config.get("max_length", 256))
        return cls(model, tokenizer, **kwargs)

    def encode(self, sentences):
        """Strings -> list of id lists (EOS-terminated, truncated to max_input_length)."""
        ragged = self.tokenizer.tokenize(tf.constant(sentences, tf.string)).to_list()
        encoded = []
        for number, ids in enumerate(ragged):
            if len(ids) + 1 > self.max_input_length:
                log.warning("input %d has %d tokens; truncated to max_input_length=%d",
                            number + 1, len(ids) + 1, self.max_input_length)
                ids = ids[: self.max_input_length - 1]
            encoded.append(ids + [EOS_ID])
        return encoded

    def translate(self, sentences, nbest=False, progress=None):
        """Translates a list of strings; returns strings (or, with nbest, lists of
        (translation, score) pairs, best first). Empty inputs give empty outputs."""
        sentences = [normalize_whitespace(s.rstrip("\n")) for s in sentences]
        results = [[("", 0.0)] if not s else None for s in sentences]
        todo = [i for i, s in enumerate(sentences) if s]
        encoded = dict(zip(todo, self.encode([sentences[i] for i in todo]))) if todo else {}
        order = sorted(todo, key=lambda i: len(encoded[i]))
        for start in range(0, len(order), self.batch_size):
            chunk = order[start: start + self.batch_size]
            width = max(len(encoded[i]) for i in chunk)
            ids = np.zeros((len(chunk), width), np.int32)
            for row, i in enumerate(chunk):
                ids[row, : len(encoded[i])] = encoded[i]
            outputs = self._search(tf.constant(ids))
            texts = self._detokenize(outputs["ids"])
            scores = outputs["scores"].numpy()
            for row, i in enumerate(chunk):
                results[i] = [(texts[row][j], float(scores[row, j]))
                              for j in range(len(texts[row])) if scores[row, j] > -1e8]
            if progress is not None:
                progress.update(len(chunk))
        if nbest:
            return results
        return [r[0][0] for r in results]

    def _detokenize(self, ids):
        ids = ids.numpy()
        batch, beams, length = ids.shape
        flat = self.tokenizer.detokenize_dense(ids.reshape(batch * beams, length)).numpy()
        return [[t.decode("utf-8") for t in flat[b * beams:(b + 1) * beams]]
                for b in range(batch)]


def _as_nbest(ids, scores):
    """Greedy output in the beam-search result layout (one hypothesis per sentence)."""
    return {"ids": ids[:, None, :], "scores": scores[:, None], "log_probs": scores[:, None]}
