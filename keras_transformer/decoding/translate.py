"""Translating text with a trained model: batching, tokenization, beam or greedy search.

    translator = Translator.from_run("runs/multi30k-en-de")     # the averaged model if any
    translator.translate(["A dog runs in the park."])
    translator.translate(["A dog runs."], nbest=True)           # [[(text, score), ...]]
    translator.translate(["A dog runs."], prefixes=["Ein Hund"])  # forced start of the output
    translator.sample(["A dog runs."], num_samples=3, top_p=0.9, seed=1)
    translator.score(["A dog runs."], ["Ein Hund rennt."])      # log P(target | source)

The translator decodes in bfloat16 on CPUs with bf16 units and in float32 elsewhere
(`precision="auto"`, see `decoding.precision`); `precision="float32"` decodes in float32 (with
the model itself when it is a float32 one, as before the choice existed).
"""

import logging

import keras
import numpy as np

from keras_transformer.decoding.beam_search import compiled_beam_search
from keras_transformer.decoding.precision import cast_model, copy_weights, resolve_precision
from keras_transformer.decoding.options import (
    check_prefixes, check_sampling, check_search_options, check_targets)
from keras_transformer.decoding.sampling import compiled_sample_search
from keras_transformer.decoding.scoring import compiled_scorer
from keras_transformer.decoding.search import (
    XLA_WIDTH_STEP, compiled_greedy_search, dynamic_shapes)
from keras_transformer.defaults import MAX_LENGTH, TRANSLATION
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
        check_search_options(beam_size, batch_size, alpha)
        self.precision, self.precision_reason = resolve_precision(precision)
        self.source_model, self.tokenizer = model, tokenizer
        self.model = cast_model(model, self.precision)
        self._copied_at = _optimizer_step(model)
        # Text <-> ids in plain Python (sentencepiece), the same on every backend.
        self.vocabulary = (tokenizer if isinstance(tokenizer, Vocabulary)
                           else Vocabulary(tokenizer.model_proto))
        self.beam_size, self.alpha = beam_size, alpha
        self.max_input_length, self.batch_size = max_input_length, batch_size
        self.jit_compile, self.extra_length = jit_compile, extra_length
        self._search = self._compile_search(with_prefix=False)
        self._compiled = {}  # the searches compiled on first use: prefixes, sampling, scoring

    def _compile_search(self, with_prefix):
        options = dict(extra_length=self.extra_length, jit_compile=self.jit_compile,
                       with_prefix=with_prefix)
        if self.beam_size > 1:
            return compiled_beam_search(self.model, self.beam_size, self.alpha, **options)
        greedy = compiled_greedy_search(self.model, **options)
        return lambda *inputs: _as_nbest(*greedy(*inputs))

    def _compiled_once(self, key, build):
        if key not in self._compiled:
            self._compiled[key] = build()
        return self._compiled[key]

    @classmethod
    def from_run(cls, run, model_file=None, **kwargs):
        """A translator of a run (a `Run` or its directory): `model_file`, else the averaged
        model if there is one, else the final one; inputs truncated at the run's max_length.
        A directory of member runs (`runs.EnsembleRun`) translates with their ensemble."""
        run = run if isinstance(run, Run) else open_run(run)
        model = run.load_model(path=model_file)
        kwargs.setdefault("max_input_length", run.config.max_length)
        return cls(model, run.vocabulary(), **kwargs)

    def search_ids(self, source_ids, prefix_ids=None):
        """The search on a batch of id rows ((N, S) int32, EOS-terminated, 0-padded, e.g. from
        `encode`) [and of prefix rows ((N, P) int32, 0-padded)]: {"ids": (N, K, T) hypotheses
        best first, "scores": (N, K)}, K = 1 for greedy search."""
        self._follow_training()
        if prefix_ids is None:
            return self._search(source_ids)
        search = self._compiled_once("prefix", lambda: self._compile_search(with_prefix=True))
        return search(source_ids, prefix_ids)

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

    def encode_targets(self, sentences):
        """Strings -> id lists without EOS (prefixes) in the run's vocabulary."""
        return self.vocabulary.encode(
            [normalize_whitespace(s.rstrip("\n")) if s else "" for s in sentences])

    def translate(self, sentences, nbest=False, progress=None, prefixes=None):
        """Translates a list of strings; returns strings (or, with nbest, lists of
        (translation, score) pairs, best first). Empty inputs give empty outputs.

        prefixes: None, or one string per sentence ("" for none): that sentence's output
        starts with the prefix's subword tokens and the search continues after them; the
        prefix's log-probabilities count in the score.
        """
        prefix_ids = self._prefix_ids(sentences, prefixes)
        return self._decode(sentences, prefix_ids, self.search_ids, nbest, progress)

    def sample(self, sentences, num_samples=1, top_k=0, top_p=1.0, temperature=1.0, seed=0,
               prefixes=None, progress=None):
        """Random samples instead of the search's best: per sentence a list of num_samples
        (translation, log P(translation | sentence)) pairs, drawn from the model's
        distribution narrowed to its top_k tokens (0: all) and to the smallest set holding
        top_p of the probability (1: all), at `temperature`. The same seed gives the same
        samples for the same sentences and batch size on one backend
        (`decoding.sampling`). Empty inputs give [("", 0.0)]."""
        check_sampling(num_samples, top_k, top_p, temperature, seed)
        prefix_ids = self._prefix_ids(sentences, prefixes)
        with_prefix = prefix_ids is not None
        key = ("sample", num_samples, top_k, float(top_p), float(temperature), with_prefix)
        sampler = self._compiled_once(key, lambda: compiled_sample_search(
            self.model, num_samples, top_k, top_p, temperature, self.extra_length,
            self.jit_compile, with_prefix))

        def search(ids, prefix=None):
            self._follow_training()
            seed_value = np.int32(seed)
            return sampler(ids, seed_value) if prefix is None else sampler(ids, seed_value,
                                                                            prefix)

        return self._decode(sentences, prefix_ids, search, True, progress)

    def score(self, sources, targets, progress=None):
        """log P(target | source) of each pair: a list of dicts {"log_prob": natural-log
        total, "tokens": subword tokens of the target with its EOS, "mean": log_prob /
        tokens}, in the order given, batched by length."""
        check_targets(sources, targets)
        scorer = self._compiled_once("score", lambda: compiled_scorer(self.model,
                                                                      self.jit_compile))
        sources = [normalize_whitespace(s.rstrip("\n")) for s in sources]
        encoded = self.encode(sources) if sources else []
        target_ids = [ids + [EOS_ID] for ids in self.encode_targets(targets)] if targets else []
        results = [None] * len(sources)
        order = sorted(range(len(sources)), key=lambda i: (len(encoded[i]), len(target_ids[i])))
        for chunk, ids, extra in self._batches(order, encoded, target_ids):
            self._follow_training()
            outputs = scorer(ids, extra)
            totals, counts = np.asarray(outputs["log_prob"]), np.asarray(outputs["tokens"])
            for row, i in enumerate(chunk):
                total, tokens = float(totals[row]), int(counts[row])
                results[i] = {"log_prob": total, "tokens": tokens, "mean": total / tokens}
            if progress is not None:
                progress.update(len(chunk))
        return results

    def _prefix_ids(self, sentences, prefixes):
        """The prefixes' id lists (None when no sentence has one)."""
        check_prefixes(sentences, prefixes)
        if prefixes is None:
            return None
        if not any(p and p.strip() for p in prefixes):
            return None
        return self.encode_targets([p or "" for p in prefixes])

    def _decode(self, sentences, prefix_ids, search, nbest, progress):
        sentences = [normalize_whitespace(s.rstrip("\n")) for s in sentences]
        results = [[("", 0.0)] if not s else None for s in sentences]
        todo = [i for i, s in enumerate(sentences) if s]
        encoded = dict(zip(todo, self.encode([sentences[i] for i in todo]))) if todo else {}
        order = sorted(todo, key=lambda i: len(encoded[i]))
        for chunk, ids, prefix in self._batches(order, encoded, prefix_ids):
            outputs = search(ids) if prefix is None else search(ids, prefix)
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

    def _batches(self, order, encoded, extra=None):
        """(chunk of indices, (n, width) int32 ids, (n, width') int32 rows of `extra` or None)
        for batch_size sentences at a time in `order`; widths padded to a multiple of
        XLA_WIDTH_STEP where the search compiles per shape."""
        static = self.jit_compile or not dynamic_shapes()
        for start in range(0, len(order), self.batch_size):
            chunk = order[start: start + self.batch_size]
            ids = _padded([encoded[i] for i in chunk], static, self.max_input_length)
            rows = None if extra is None else _padded([extra[i] for i in chunk], static)
            yield chunk, ids, rows

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


def _padded(rows, static, cap=None):
    """Id lists -> (n, width) int32, 0-padded, at least one column; with `static`, the width
    rounded up to a multiple of XLA_WIDTH_STEP (at most max(cap, the longest row))."""
    width = max([len(row) for row in rows] + [1])
    if static:  # a few widths, a few compilations
        step = XLA_WIDTH_STEP
        rounded = -(-width // step) * step
        width = rounded if cap is None else min(rounded, max(cap, width))
    array = np.zeros((len(rows), width), np.int32)
    for number, row in enumerate(rows):
        array[number, : len(row)] = row
    return array


def _as_nbest(ids, scores):
    """Greedy output in the beam-search result layout (one hypothesis per sentence)."""
    return {"ids": ids[:, None, :], "scores": scores[:, None], "log_probs": scores[:, None]}
