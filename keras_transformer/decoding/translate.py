"""Translating text with a trained model: batching, tokenization, beam or greedy search.

    translator = Translator.from_run("runs/multi30k-en-de")     # the averaged model if any
    translator.translate(["A dog runs in the park."])

The translator decodes in bfloat16 on CPUs with bf16 units and in float32 elsewhere
(`precision="auto"`, see `decoding.precision`); `precision="float32"` decodes in float32 (with
the model itself when it is a float32 one, as before the choice existed).
"""

import logging

import keras
import numpy as np

from keras_transformer.decoding.beam_search import compiled_beam_search
from keras_transformer.decoding.precision import cast_model, copy_weights, resolve_precision
from keras_transformer.decoding.search import (
    XLA_WIDTH_STEP, compiled_greedy_search, dynamic_shapes)
from keras_transformer.defaults import MAX_LENGTH, TRANSLATION
from keras_transformer.errors import InputError
from keras_transformer.runs import Run, open_run
from pipelines.special_ids import EOS_ID
from pipelines.vocabulary import Vocabulary, normalize_whitespace

log = logging.getLogger(__name__)


class Translator:
    """Translates batches of sentences with beam search (or greedy search, beam_size=1).

    Args:
        model: a `Transformer`.
        tokenizer: the run's `Vocabulary` (or its TensorFlow `SubwordTokenizer`).
        beam_size: 4 in the paper; 1 runs greedy search.
        alpha: length penalty (paper: 0.6).
        max_input_length: longer inputs (in subword tokens, EOS included) are truncated to
            this length with a warning naming the sentence.
        batch_size: sentences per search call (sentences are sorted by length first).
        extra_length: maximum output length = input length + extra_length (paper: 50 for
            translation, 300 for parsing).
        jit_compile: compile the search with XLA (once per batch shape: batches are padded
            to a multiple of `search.XLA_WIDTH_STEP` tokens to bound the compilations). Faster
            per batch on CPU (1.4x at batch 32, 1.3x at batch 1 on the base preset), after a
            compilation of seconds per shape: worth it for many batches or a long-lived
            process. Under JAX the search is always compiled (jax.jit), widths padded
            the same way.
        precision: "auto" (bfloat16 on CPUs with bf16 units, AMX or AVX-512 BF16; float32
            elsewhere), "float32" or "bfloat16". In bfloat16 the translator searches a copy
            of `model` whose weights are cast to bfloat16 here, once (`self.model`; the
            LayerNorms keep float32); the log-softmax, scores and length penalty stay float32. A model still being trained
            (its optimizer has stepped since the copy) is copied again before a translation.

    Attributes:
        precision: the dtype it computes in, "float32" or "bfloat16".
        precision_reason: why, in one line (e.g. "bf16: this CPU has avx512_bf16; ...").
    """

    def __init__(self, model, tokenizer, beam_size=TRANSLATION.beam_size,
                 alpha=TRANSLATION.alpha, max_input_length=MAX_LENGTH,
                 batch_size=TRANSLATION.batch_size, extra_length=TRANSLATION.extra_length,
                 jit_compile=False, precision="auto"):
        if not isinstance(beam_size, int) or beam_size < 1:
            raise InputError(f"beam_size={beam_size!r} must be an integer of at least 1.")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise InputError(f"batch_size={batch_size!r} must be an integer of at least 1.")
        if alpha < 0:
            raise InputError(f"alpha={alpha!r} must be at least 0.")
        self.precision, self.precision_reason = resolve_precision(precision)
        self.source_model, self.tokenizer = model, tokenizer
        self.model = cast_model(model, self.precision)
        self._copied_at = _optimizer_step(model)
        # Text <-> ids in plain Python (sentencepiece), the same on every backend.
        self.vocabulary = (tokenizer if isinstance(tokenizer, Vocabulary)
                           else Vocabulary(tokenizer.model_proto))
        self.beam_size, self.alpha = beam_size, alpha
        self.max_input_length, self.batch_size = max_input_length, batch_size
        self.jit_compile = jit_compile
        if beam_size == 1:
            greedy = compiled_greedy_search(self.model, extra_length=extra_length,
                                            jit_compile=jit_compile)
            self._search = lambda ids: _as_nbest(*greedy(ids))
        else:
            self._search = compiled_beam_search(self.model, beam_size, alpha,
                                                extra_length=extra_length,
                                                jit_compile=jit_compile)

    @classmethod
    def from_run(cls, run, model_file=None, **kwargs):
        """A translator of a run (a `Run` or its directory): `model_file`, else the averaged
        model if there is one, else the final one; inputs truncated at the run's max_length.
        A directory of member runs (`runs.EnsembleRun`) translates with their ensemble."""
        run = run if isinstance(run, Run) else open_run(run)
        model = run.load_model(path=model_file)
        kwargs.setdefault("max_input_length", run.config.max_length)
        return cls(model, run.vocabulary(), **kwargs)

    def search_ids(self, source_ids):
        """The search on a batch of id rows ((N, S) int32, EOS-terminated, 0-padded, e.g. from
        `encode`): {"ids": (N, K, T) hypotheses best first, "scores": (N, K)}, K = 1 for greedy
        search."""
        self._follow_training()
        return self._search(source_ids)

    def _follow_training(self):
        """Copies the weights again into a cast copy of a model that has trained since."""
        if self.model is self.source_model:
            return
        step = _optimizer_step(self.source_model)
        if step != self._copied_at:
            copy_weights(self.source_model, self.model)
            self._copied_at = step

    def encode(self, sentences):
        """Strings -> list of id lists (EOS-terminated, truncated to max_input_length)."""
        encoded = []
        for number, ids in enumerate(self.vocabulary.encode(sentences)):
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
            if self.jit_compile or not dynamic_shapes():  # a few widths, a few compilations
                step = XLA_WIDTH_STEP
                width = min(-(-width // step) * step, max(self.max_input_length, width))
            ids = np.zeros((len(chunk), width), np.int32)
            for row, i in enumerate(chunk):
                ids[row, : len(encoded[i])] = encoded[i]
            outputs = self.search_ids(ids)
            texts = self._detokenize(outputs["ids"])
            scores = np.asarray(outputs["scores"])
            for row, i in enumerate(chunk):
                results[i] = [(texts[row][j], float(scores[row, j]))
                              for j in range(len(texts[row])) if scores[row, j] > -1e8]
            if progress is not None:
                progress.update(len(chunk))
        if nbest:
            return results
        return [r[0][0] for r in results]

    def _detokenize(self, ids):
        ids = np.asarray(ids)
        batch, beams, length = ids.shape
        flat = self.vocabulary.decode(ids.reshape(batch * beams, length))
        return [flat[b * beams:(b + 1) * beams] for b in range(batch)]


def _optimizer_step(model):
    """The optimizer's step count of a model being trained (None without an optimizer)."""
    optimizer = getattr(model, "optimizer", None)
    iterations = getattr(optimizer, "iterations", None)
    return None if iterations is None else int(keras.ops.convert_to_numpy(iterations))


def _as_nbest(ids, scores):
    """Greedy output in the beam-search result layout (one hypothesis per sentence)."""
    return {"ids": ids[:, None, :], "scores": scores[:, None], "log_probs": scores[:, None]}
