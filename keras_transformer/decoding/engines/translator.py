"""The Keras engine: translating text with a trained model (TensorFlow or JAX, float32 or
bfloat16, one model or an ensemble) by beam, greedy or sampling search, and scoring. The text
layer (normalization, empty lines, prefixes, batching, results) is `engine.Engine`'s; this
module holds the id-level part: ids in, the compiled searches, ids out.

    translator = Decoder.resolve(open_run("runs/multi30k-en-de")).engine()  # the run's choice
    translator.translate(["A dog runs in the park."])
    translator.translate(["A dog runs."], nbest=True)           # [[(text, score), ...]]
    translator.translate(["A dog runs."], prefixes=["Ein Hund"])  # forced start of the output
    translator.sample(["A dog runs."], num_samples=3, top_p=0.9, seed=1)
    translator.score(["A dog runs."], ["Ein Hund rennt."])      # log P(target | source)
    translator.translate(["A dog runs."], alignments=True)      # [(text, "0-0 1-1 2-2")]
    translator.translate(["A dog runs."], constraints=[["Hund"]])  # phrases in the output

A translator is built by the decoder (`decoding.decoder.Decoder`), which reads the run's saved
choice and resolves `precision: auto` (bfloat16 on CPUs with bf16 units, float32 elsewhere:
`decoding.engines.precision`) and `xla: auto` (`decoding.engines.xla`) once; the translator
takes what was resolved. Built directly (`Translator(model, vocabulary)`, a model in memory) it
searches in float32 without XLA unless told otherwise; float32 searches the model itself when
it is a float32 one.
"""

import logging
import os
import threading

import keras
import numpy as np

from keras_transformer.decoding.search.alignment import align_ids, pharaoh_lines, starts_word_table
from keras_transformer.decoding.search.beam_search import compiled_beam_search
from keras_transformer.decoding.search.compiling import (
    bucket_rows, bucket_width, compile_search, dynamic_shapes, pad_rows, unpad_rows)
from keras_transformer.decoding.engines.engine import Engine
from keras_transformer.decoding.engines.precision import (
    DTYPES, cast_model, copy_weights, resolve_precision)
from keras_transformer.decoding.engines.xla import resolve_xla
from keras_transformer.decoding.request import DEFAULTS, TRANSLATE, check
from keras_transformer.decoding.search.sampling import compiled_sample_search
from keras_transformer.decoding.search.scoring import compiled_scorer
from keras_transformer.decoding.search.greedy import compiled_greedy_search
from keras_transformer.defaults import MAX_LENGTH
from keras_transformer.errors import InputError
from pipelines.special_ids import EOS_ID
from pipelines.vocabulary import Vocabulary

log = logging.getLogger(__name__)


class Translator(Engine):
    """The Keras engine: translates batches of sentences with beam search (or greedy search,
    beam_size=1) or sampling, and scores pairs (the Python API: `engine.Engine`).

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
        stop_horizon: beam search stops a sentence once no alive hypothesis, ending within
            this many more steps, could beat its worst finished one (0: the exact rule;
            `beam_search`).
        no_repeat_ngram_size, repetition_penalty: the repetition controls of greedy and
            beam search (`decoding.search.repetition`): no repeated n-gram of this size
            (0: off), the sign-aware penalty on the logits of tokens already generated
            (1.0: off).
        jit_compile: compile the search with XLA (True or False: the decoder resolves
            "auto", where it was measured faster on this CPU class and precision,
            `decoding.engines.xla`). XLA compiles once per input shape, so batches are
            padded to a few shapes (rows to a power of two up to batch_size, widths to a few
            steps: `compiling.bucket_rows`, `bucket_width`), the same outputs per sentence; a
            compilation takes seconds, which the command's persistent cache
            (`cli.compilation_cache`) pays once per machine. Under JAX the search is always
            compiled (jax.jit), on the same buckets.
        precision: "float32" or "bfloat16" (the decoder resolves "auto": bfloat16 on CPUs
            with bf16 units, AMX or AVX-512 BF16; float32 elsewhere). In bfloat16 the
            translator searches a copy of `model` whose weights are cast to bfloat16 here,
            once (`self.model`; the LayerNorms keep float32); the log-softmax, scores and
            length penalty stay float32. A model still being trained (its optimizer has
            stepped since the copy) is copied again before a translation.
        precision_reason, xla_reason: why that precision and that XLA setting, in one line
            each (the decoder's; default: they were given).

    Attributes:
        in_flight: batches searched at once, each from a thread of its own (2; 1 on a
            one-core machine): a step-by-step graph leaves cores idle between its small ops,
            which a second search fills (`docs/performance.md`); the outputs are the same.
        precision: the dtype it computes in, "float32" or "bfloat16".
        precision_reason: why, in one line (e.g. "bf16: this CPU has avx512_bf16; ...").
        jit_compile: whether the search is compiled by XLA; `xla_reason` says why.
    """

    NAME = "tensorflow"
    in_flight = min(2, os.cpu_count() or 1)
    SUPPORTS = frozenset({"beam_size", "alpha", "extra_length", "batch_size", "nbest",
                          "prefixes", "sample", "top_k", "top_p", "temperature", "seed",
                          "num_samples", "precision", "xla", "score", "alignments",
                          "constraints", "stop_horizon", "no_repeat_ngram_size",
                          "repetition_penalty"})

    def __init__(self, model, tokenizer, beam_size=DEFAULTS["beam_size"],
                 alpha=DEFAULTS["alpha"], max_input_length=MAX_LENGTH,
                 batch_size=DEFAULTS["batch_size"], extra_length=DEFAULTS["extra_length"],
                 jit_compile=False, precision="float32", stop_horizon=DEFAULTS["stop_horizon"],
                 precision_reason=None, xla_reason=None,
                 no_repeat_ngram_size=DEFAULTS["no_repeat_ngram_size"],
                 repetition_penalty=DEFAULTS["repetition_penalty"]):
        check(dict(beam_size=beam_size, alpha=alpha, batch_size=batch_size,
                   extra_length=extra_length, stop_horizon=stop_horizon,
                   no_repeat_ngram_size=no_repeat_ngram_size,
                   repetition_penalty=repetition_penalty))
        if precision not in DTYPES:
            raise InputError(f"precision={precision!r} must be one of {', '.join(DTYPES)} (the "
                             "decoder resolves 'auto': decoding.decoder.Decoder).")
        if not isinstance(jit_compile, bool):
            raise InputError(f"jit_compile={jit_compile!r} must be True or False (the decoder "
                             "resolves 'auto': decoding.decoder.Decoder).")
        self.precision = precision
        self.precision_reason = precision_reason or f"{precision}: given"
        self.xla_reason = xla_reason or f"--{'' if jit_compile else 'no-'}xla given"
        self.source_model, self.tokenizer = model, tokenizer
        self.model = cast_model(model, self.precision)
        self._copied_at = _optimizer_step(model)
        # Text <-> ids in plain Python (sentencepiece), the same on every backend.
        self.vocabulary = (tokenizer if isinstance(tokenizer, Vocabulary)
                           else Vocabulary(tokenizer.model_proto))
        self.beam_size, self.alpha = beam_size, alpha
        self.max_input_length, self.batch_size = max_input_length, batch_size
        self.jit_compile, self.extra_length = jit_compile, extra_length
        self.stop_horizon = stop_horizon
        self.repetition = dict(no_repeat_ngram_size=no_repeat_ngram_size,
                               repetition_penalty=float(repetition_penalty))
        self._search = self._compile_search(with_prefix=False)
        self._compiled = {}  # the searches compiled on first use: prefixes, sampling, scoring
        self._lock = threading.Lock()  # searches run from several threads (in_flight)

    def _compile_search(self, with_prefix, with_constraints=False):
        options = dict(extra_length=self.extra_length, jit_compile=self.jit_compile,
                       with_prefix=with_prefix, **self.repetition)
        if with_constraints:
            return compiled_beam_search(self.model, self.beam_size, self.alpha,
                                        with_constraints=True, stop_horizon=self.stop_horizon,
                                        **options)
        if self.beam_size > 1:
            return compiled_beam_search(self.model, self.beam_size, self.alpha,
                                        stop_horizon=self.stop_horizon, **options)
        greedy = compiled_greedy_search(self.model, **options)
        return lambda *inputs: _as_nbest(*greedy(*inputs))

    def _compiled_once(self, key, build):
        with self._lock:
            if key not in self._compiled:
                self._compiled[key] = build()
            return self._compiled[key]

    @classmethod
    def from_request(cls, request, model, tokenizer, max_input_length=MAX_LENGTH,
                     command=TRANSLATE, precision=None, xla=None):
        """The translator of a decoding request (`decoding.request.Request`) for `command`;
        what the request asks for that this engine lacks is refused by name. The decoder
        (`decoding.decoder.Decoder`) builds engines this way. `precision` and `xla`: the
        (value, reason) pairs the decoder resolved (`Decoder.precision`, `Decoder.xla`); else
        resolved here from the request's settings, by the same rules."""
        cls.refuse_unsupported(request.engine_options(command))
        precision = precision or resolve_precision(request.precision)
        xla = xla or resolve_xla(request.xla, precision[0])
        return cls(model, tokenizer, beam_size=request.beam_size, alpha=request.alpha,
                   max_input_length=max_input_length, batch_size=request.batch_size,
                   extra_length=request.extra_length, jit_compile=xla[0],
                   precision=precision[0], stop_horizon=request.stop_horizon,
                   precision_reason=precision[1], xla_reason=xla[1],
                   no_repeat_ngram_size=request.no_repeat_ngram_size,
                   repetition_penalty=request.repetition_penalty)

    def search_ids(self, source_ids, prefix_ids=None, constraint_ids=None):
        """The search on a batch of id rows ((N, S) int32, EOS-terminated, 0-padded, e.g. from
        `encode`) [and of prefix rows ((N, P) int32, 0-padded)] [and of constraints ((N, C, L)
        int32 phrases, 0-padded, `decoding.search.constraints`; beam search only)]:
        {"ids": (N, K, T) hypotheses best first, "scores": (N, K)}, K = 1 for greedy
        search."""
        if constraint_ids is not None:
            if self.beam_size < 2:
                raise InputError("constraints need beam search: use a beam of 2 or more.")
            with_prefix = prefix_ids is not None
            search = self._compiled_once(("constraints", with_prefix), lambda: (
                self._compile_search(with_prefix, with_constraints=True)))
            self._follow_training()
            return self._on_bucket(search, source_ids, constraint_ids,
                                   *([prefix_ids] if with_prefix else []))
        self._follow_training()
        if prefix_ids is None:
            return self._on_bucket(self._search, source_ids)
        search = self._compiled_once("prefix", lambda: self._compile_search(with_prefix=True))
        return self._on_bucket(search, source_ids, prefix_ids)

    @property
    def static_shapes(self):
        """Whether the searches compile per input shape (XLA, JAX): inputs go on buckets."""
        return self.jit_compile or not dynamic_shapes()

    def _on_bucket(self, function, *rows):
        """`function(*rows)` on a bucket of rows where shapes are static (each (n, ...) array
        padded to `bucket_rows(n)` rows by repeating its first row, the outputs cut back to
        n rows); as it is elsewhere."""
        count = len(rows[0])
        bucket = bucket_rows(count, self.batch_size) if self.static_shapes else count
        if bucket == count:
            return function(*rows)
        return unpad_rows(function(*[pad_rows(array, bucket) for array in rows]), count)

    def _follow_training(self):
        """Copies the weights again into a cast copy of a model that has trained since."""
        if self.model is self.source_model:
            return
        with self._lock:
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
        """Normalized strings -> id lists without EOS (prefixes, targets) in the run's
        vocabulary."""
        return self.vocabulary.encode(list(sentences))

    # -- id level (see `engine.Engine`) ------------------------------------------------------
    def _searcher(self, nbest, alignments=False):
        def search(sources, prefixes, constraints=None):
            ids = self._padded(sources)
            outputs = self.search_ids(
                ids, None if prefixes is None else self._padded(prefixes, capped=False),
                None if constraints is None else self._phrases(constraints))
            hypotheses = self._hypotheses(outputs)
            if not alignments:
                return hypotheses
            # The best hypothesis of each row, or with nbest every one (one decoder pass).
            found = np.asarray(outputs["ids"])[:, : None if nbest else 1]
            rows, kept = found.shape[:2]
            lines = self.align_ids(np.repeat(ids, kept, axis=0),
                                   found.reshape(rows * kept, -1))
            return [[(text, score, lines[row * kept + j])
                     for j, (text, score) in enumerate(hypotheses[row][:kept])]
                    for row in range(rows)]

        return search

    def align_ids(self, source_ids, target_ids):
        """The word alignments (Pharaoh strings) of given targets, teacher-forced
        (`decoding.search.alignment.align_ids`, compiled once): source_ids (N, S) as the search takes
        them, target_ids (N, T) as it returns them (EOS-terminated, 0-padded, no BOS)."""
        aligner = self._compiled_once("align", self._compile_aligner)
        self._follow_training()
        target_ids = np.asarray(target_ids, np.int32)
        if self.static_shapes:  # a few widths, a few compilations
            width = bucket_width(target_ids.shape[1])
            target_ids = np.pad(target_ids, [(0, 0), (0, width - target_ids.shape[1])])
        links = self._on_bucket(aligner, np.asarray(source_ids, np.int32), target_ids)
        return pharaoh_lines({"links": links})

    def _compile_aligner(self):
        starts_word = starts_word_table(self.vocabulary.pieces())

        def align(source_ids, static, target_ids):
            return align_ids(self.model, source_ids, target_ids, starts_word)["links"]

        return compile_search(self.model, align, lambda links: links, self.jit_compile,
                              (((None, None), "int32"),))

    def _aligner(self):
        def align(sources, targets):
            return self.align_ids(self._padded(sources),
                                  self._padded([row + [EOS_ID] for row in targets],
                                               capped=False))

        return align

    def _sampler(self, num_samples, top_k, top_p, temperature, seed):
        """The sampling search, compiled once per (options, with prefix)."""
        def search(sources, prefixes):
            with_prefix = prefixes is not None
            key = ("sample", num_samples, top_k, float(top_p), float(temperature), with_prefix)
            sampler = self._compiled_once(key, lambda: compiled_sample_search(
                self.model, num_samples, top_k, top_p, temperature, self.extra_length,
                self.jit_compile, with_prefix))
            self._follow_training()
            inputs = [self._padded(sources), np.int32(seed)]
            if with_prefix:
                inputs.append(self._padded(prefixes, capped=False))
            return self._hypotheses(sampler(*inputs))

        return search

    def _scorer(self):
        scorer = self._compiled_once("score", lambda: compiled_scorer(self.model,
                                                                      self.jit_compile))

        def score(sources, targets):
            self._follow_training()
            outputs = self._on_bucket(scorer, self._padded(sources),
                                      self._padded([row + [EOS_ID] for row in targets],
                                                   capped=False))
            totals, counts = np.asarray(outputs["log_prob"]), np.asarray(outputs["tokens"])
            return [(float(total), int(count)) for total, count in zip(totals, counts)]

        return score

    def _hypotheses(self, outputs):
        """Per row, [(text, score)] of the search's live hypotheses, best first."""
        texts = self._detokenize(outputs["ids"])
        scores = np.asarray(outputs["scores"])
        return [[(texts[row][j], float(scores[row, j])) for j in range(len(texts[row]))
                 if scores[row, j] > -1e8] for row in range(len(texts))]

    def _padded(self, rows, capped=True):
        """Id rows as one (n, width) int32 array; widths padded to a bucket
        (`compiling.bucket_width`) where the search compiles per shape (sources: at most up
        to max_input_length, `capped`)."""
        return _padded(rows, self.static_shapes, self.max_input_length if capped else None)

    def _phrases(self, rows):
        """Per row a list of phrases' id lists as one (n, C, L) int32 array, 0-padded to the
        most phrases and the longest phrase (where the search compiles per shape: C and L
        rounded up to powers of two, to bound the compilations)."""
        count = max([len(phrases) for phrases in rows] + [1])
        width = max([len(phrase) for phrases in rows for phrase in phrases] + [1])
        if self.static_shapes:
            count, width = 1 << (count - 1).bit_length(), 1 << (width - 1).bit_length()
        array = np.zeros((len(rows), count, width), np.int32)
        for number, phrases in enumerate(rows):
            for c, phrase in enumerate(phrases):
                array[number, c, : len(phrase)] = phrase
        return array

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
    padded to its bucket (`compiling.bucket_width`: at most max(cap, the longest row))."""
    width = max([len(row) for row in rows] + [1])
    if static:  # a few widths, a few compilations
        width = bucket_width(width, cap)
    array = np.zeros((len(rows), width), np.int32)
    for number, row in enumerate(rows):
        array[number, : len(row)] = row
    return array


def _as_nbest(ids, scores):
    """Greedy output in the beam-search result layout (one hypothesis per sentence)."""
    return {"ids": ids[:, None, :], "scores": scores[:, None], "log_probs": scores[:, None]}
