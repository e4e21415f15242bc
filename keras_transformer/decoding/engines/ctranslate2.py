"""The CTranslate2 engine: a folder written by `export.ct2.export_ctranslate2` run by
CTranslate2 (OpenNMT's C++ inference engine) under the text layer of every engine
(`engine.Engine`): the same normalization, empty lines, prefixes and results as the Keras
engine (`Translator`). This module is the id level: sentencepiece pieces in, CTranslate2's
`translate_batch`/`score_batch`, pieces out. The differences of CTranslate2's own search are
in docs/export.md.

    engine = CTranslate2Translator("saved_models/multi30k-en-de/ctranslate2", beam_size=4)
    engine.translate(["A dog runs."])
    engine.translate(["A dog runs."], alignments=True)   # from CTranslate2's return_attention

This module imports neither TensorFlow nor Keras (word alignments do, when asked for): the
`translate --engine ctranslate2` command runs at CTranslate2's own price, start-up included.
Its workers and threads default to the setting measured fastest (`default_threading`).
"""

import copy
import json
import os
import pathlib

from keras_transformer.decoding.engines.engine import Engine, submitted_in_order
from keras_transformer.decoding.request import DEFAULTS, TRANSLATE, check
from keras_transformer.errors import InputError
from pipelines.vocabulary import FILENAME as VOCABULARY_FILE

INSTALL_HINT = "pip install 'keras-transformer[ctranslate2]' (or pip install ctranslate2==4.8.5)"
METADATA = "keras_transformer.json"  # what the export adds to the folder: how to feed the model


def default_threading(workers=None, threads=None, cores=None):
    """(workers, threads) of CTranslate2 on `cores` (default: the cores this process may
    use): what is given, the rest chosen. Unset, one worker per core with one thread each:
    on the 2-core machines the fastest setting by far for a whole file, a batch of 32 and
    one sentence alike (docs/performance.md, "CTranslate2 at its best"), as CTranslate2's
    own docs advise for throughput (workers share the weights). Given workers alone, the
    cores are divided among them; given threads alone, as many workers as fit."""
    if cores is None:
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
    if workers is None and threads is None:
        return max(1, cores), 1
    if workers is None:
        return max(1, cores // threads), threads
    if threads is None:
        return workers, max(1, cores // workers)
    return workers, threads


def require_ctranslate2():
    """The ctranslate2 module, or a one-line InputError saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise InputError(f"The ctranslate2 package is not installed: {INSTALL_HINT}.") from None
    return ctranslate2


class CTranslate2Translator(Engine):
    """Translates with an exported CTranslate2 folder, with the rules of our `Translator`.

    Inputs longer than the export's max_input_length are truncated (EOS kept), and each
    sentence may produce up to its input length + extra_length tokens with EOS (sentences of
    equal limit are decoded together, so that each gets exactly its own limit).

    Args:
        model_dir: the folder `export_ctranslate2` wrote.
        beam_size, batch_size, extra_length: as for `Translator`.
        alpha: CTranslate2's length penalty, score / length^alpha (not GNMT's
            ((5 + length) / 6)^alpha: the two rank beams a little differently).
        device: "cpu" or "cuda".
        compute_type: CTranslate2's ("default": the saved weights' type where the device
            supports it).
        workers: searches run at once (CTranslate2's inter_threads), each batch handed to
            the next free worker; threads: each worker's threads (intra_threads). Defaults:
            `default_threading` (one worker per core, one thread each). Sampling runs on one
            worker with every thread, so that a seed gives the same samples.
        no_repeat_ngram_size, repetition_penalty: the repetition controls, passed to
            CTranslate2's translate_batch as they are (its rules are ours,
            `decoding.search.repetition`); off by default.
    """

    NAME = "ctranslate2"
    SUPPORTS = frozenset({"beam_size", "alpha", "extra_length", "batch_size", "nbest",
                          "prefixes", "sample", "top_k", "top_p", "temperature", "seed",
                          "num_samples", "score", "alignments", "workers", "threads",
                          "no_repeat_ngram_size", "repetition_penalty"})

    def __init__(self, model_dir, beam_size=DEFAULTS["beam_size"], alpha=DEFAULTS["alpha"],
                 batch_size=DEFAULTS["batch_size"], extra_length=DEFAULTS["extra_length"],
                 device="cpu", compute_type="default", threads=None, workers=None,
                 no_repeat_ngram_size=DEFAULTS["no_repeat_ngram_size"],
                 repetition_penalty=DEFAULTS["repetition_penalty"]):
        self.ctranslate2 = require_ctranslate2()
        import sentencepiece as spm

        check(dict(beam_size=beam_size, alpha=alpha, batch_size=batch_size,
                   extra_length=extra_length, workers=workers, threads=threads,
                   no_repeat_ngram_size=no_repeat_ngram_size,
                   repetition_penalty=repetition_penalty))
        self.model_dir = pathlib.Path(model_dir)
        metadata_path = self.model_dir / METADATA
        if not metadata_path.is_file():
            raise InputError(f"{self.model_dir} is not a CTranslate2 export of keras-transformer "
                             f"({METADATA} is missing): run keras-transformer export --format "
                             "ctranslate2.")
        metadata = json.loads(metadata_path.read_text(encoding="utf-8"))
        self.max_input_length = metadata["max_input_length"]
        self.suppressed = [[piece] for piece in metadata["suppressed"]]
        self.beam_size, self.alpha = beam_size, alpha
        self.batch_size, self.extra_length = batch_size, extra_length
        # Passed through as they are: translate_batch's own (the same rules, applied by
        # CTranslate2 to the logits before its softmax).
        self.repetition = dict(no_repeat_ngram_size=no_repeat_ngram_size,
                               repetition_penalty=float(repetition_penalty))
        self.processor = spm.SentencePieceProcessor(
            model_file=str(self.model_dir / VOCABULARY_FILE))
        self.workers, self.threads = default_threading(workers, threads)
        # Searches: a window's batches queued with CTranslate2's workers at once
        # (`Engine.submitted_ahead`, the Engine's default); samples: one batch at a time, on
        # one sampling worker, its random stream in batch order.
        self.samples_in_flight = 1
        # Files: larger windows (fuller batches of one length), the next window started
        # while the last one's tail is searched (measured: docs/performance.md).
        self.window_batches, self.windows_in_flight = 64, 2
        self._engine_options = dict(device=device, compute_type=compute_type)
        self.translator = self._engine(self.workers, self.threads)

    @classmethod
    def from_request(cls, request, model_dir, command=TRANSLATE):
        """The engine of a decoding request (`decoding.request.Request`) for `command`, on
        the export in `model_dir`; what the request asks for that CTranslate2 lacks is refused
        by name (`Engine.refuse_unsupported`)."""
        cls.refuse_unsupported(request.engine_options(command))
        return cls(model_dir, beam_size=request.beam_size, alpha=request.alpha,
                   batch_size=request.batch_size, extra_length=request.extra_length,
                   workers=request.workers, threads=request.threads,
                   no_repeat_ngram_size=request.no_repeat_ngram_size,
                   repetition_penalty=request.repetition_penalty)

    def searching_with(self, request):
        """This engine, its workers and weights shared, searching with `request`'s beam,
        length penalty, output limit and repetition controls (what it lacks refused by name,
        as `from_request` does): a server's requests of different searches on one set of
        workers."""
        self.refuse_unsupported(request.engine_options())
        variant = copy.copy(self)
        variant.beam_size, variant.alpha = request.beam_size, request.alpha
        variant.extra_length = request.extra_length
        variant.repetition = dict(no_repeat_ngram_size=request.no_repeat_ngram_size,
                                  repetition_penalty=float(request.repetition_penalty))
        return variant

    def _engine(self, workers, threads):
        return self.ctranslate2.Translator(str(self.model_dir), inter_threads=workers,
                                           intra_threads=threads, **self._engine_options)

    def encode(self, sentences):
        """Strings -> piece lists without EOS (CTranslate2 adds it), truncated so that with
        EOS they fit max_input_length."""
        pieces = self.processor.encode(list(sentences), out_type=str)
        return [p[: self.max_input_length - 1] for p in pieces]

    def encode_targets(self, sentences):
        """Normalized strings -> piece lists without EOS, not truncated."""
        return self.processor.encode(list(sentences), out_type=str)

    # -- id level (see `engine.Engine`) ------------------------------------------------------
    def _limit(self, source, prefix):
        """Our output limit: max(input + extra_length, prefix) tokens before EOS."""
        return max(len(source) + self.extra_length, len(prefix) if prefix else 0)

    def _batch_key(self, source, prefix):
        # Samples: one limit per batch, as CTranslate2 takes one per call.
        return self._limit(source, prefix), 0

    def _search_key(self, source, prefix):
        # Searches: batches of any limits, sorted by it (`_search_batch` keeps each its own).
        return 0, self._limit(source, prefix)

    def _options(self, sources, prefixes, limit=None):
        # The limit counts the output's EOS: at most length + extra_length tokens before it,
        # which is CTranslate2's bound on the tokens it returns for this max_decoding_length
        # (a target prefix counts in it).
        if limit is None:
            limit = self._limit(sources[0], prefixes and prefixes[0])
        return dict(target_prefix=None if prefixes is None else [p or None for p in prefixes],
                    max_decoding_length=limit, max_input_length=0,
                    suppress_sequences=self.suppressed, return_scores=True)

    def _searcher(self, nbest, alignments=False):
        def submit(sources, prefixes):
            collect = self._submit_batch(sources, prefixes, nbest, alignments)
            if not alignments:
                return lambda: [[(self.processor.decode(p), float(s)) for p, s in hypotheses]
                                for hypotheses in collect()]

            def aligned():
                from keras_transformer.decoding.search.alignment import ctranslate2_pharaoh

                # Our rule on CTranslate2's attention (`alignment.ctranslate2_pharaoh`).
                return [[(self.processor.decode(p), float(s), ctranslate2_pharaoh(source, p, a))
                         for p, s, a in hypotheses]
                        for source, hypotheses in zip(sources, collect())]

            return aligned

        def search(sources, prefixes):
            return submit(sources, prefixes)()

        search.submit = submit  # batches queued with CTranslate2's workers (`Engine._run`)
        search.batch_key = self._search_key  # batches of mixed limits
        return search

    # A sentence searched under a batch's larger limit ends as under its own when its search
    # ends well before its own limit: CTranslate2 ends each sentence of a batch on its own,
    # and a limit acts only on the step that reaches it. Where the sentence's hypotheses came
    # within this many tokens of its own limit, it is searched again under it. (Its best
    # hypothesis stands for where its search ended; test2016 and a 20,000-line file give
    # the same lines as one limit per batch, tests/test_ctranslate2.py checks it on a
    # model whose outputs run to their limits.)
    LIMIT_MARGIN = 3

    def _submit_batch(self, sources, prefixes, nbest, alignments=False):
        """Queues a batch's search with CTranslate2's workers (translate_batch,
        asynchronous) and returns what waits for it: a function giving, per row, its
        hypotheses (pieces, score[, attention]) under its own limit. The batch is searched
        once under its largest limit; each row that came within LIMIT_MARGIN tokens of its
        own limit is searched again under it (rows of one limit together) when collected."""
        limits = [self._limit(s, p) for s, p in zip(sources, prefixes or [None] * len(sources))]
        top = max(limits)
        pending = self._translate(sources, prefixes, nbest, alignments, top, asynchronous=True)

        def collect():
            found = self._hypotheses([result.result() for result in pending], alignments)
            again = {}
            for i, (limit, hypotheses) in enumerate(zip(limits, found)):
                if limit < top and max(len(h[0]) for h in hypotheses) + self.LIMIT_MARGIN >= limit:
                    again.setdefault(limit, []).append(i)
            for limit, rows in again.items():
                redone = self._hypotheses(self._translate(
                    [sources[i] for i in rows], prefixes and [prefixes[i] for i in rows], nbest,
                    alignments, limit), alignments)
                for i, hypotheses in zip(rows, redone):
                    found[i] = hypotheses
            return found

        return collect

    def _translate(self, sources, prefixes, nbest, alignments, limit, asynchronous=False):
        """translate_batch's outputs (asynchronous: what waits for each, `.result()`)."""
        return self.translator.translate_batch(
            sources, num_hypotheses=self.beam_size if nbest else 1, beam_size=self.beam_size,
            length_penalty=self.alpha, return_attention=alignments, asynchronous=asynchronous,
            **self.repetition, **self._options(sources, prefixes, limit))

    @staticmethod
    def _hypotheses(outputs, alignments):
        """Per row [(pieces, score[, attention])] of translate_batch's outputs."""
        if alignments:
            return [list(zip(output.hypotheses, output.scores, output.attention))
                    for output in outputs]
        return [list(zip(output.hypotheses, output.scores)) for output in outputs]

    def translate_pieces(self, pieces, nbest=False):
        """The search without the text layer (benchmarks): piece lists (no EOS) -> per row
        [(pieces, score)], best first, batched and queued as `translate` does."""
        keys = {i: self._search_key(row, None) for i, row in enumerate(pieces)}
        results = [None] * len(pieces)
        # (longest first, as `Engine._run` queues them)
        chunks = list(self._chunks(sorted(keys, key=keys.get), keys))[::-1]
        found_chunks = submitted_in_order(lambda chunk: self._submit_batch(
            [pieces[i] for i in chunk], None, nbest), ([chunk] for chunk in chunks),
            self.submitted_ahead)
        for chunk, found in zip(chunks, found_chunks):
            for i, hypotheses in zip(chunk, found):
                results[i] = hypotheses
        return results

    def _sampler(self, num_samples, top_k, top_p, temperature, seed):
        """Samples drawn by CTranslate2 (sampling_topk, sampling_topp, sampling_temperature)
        with its random generator seeded with `seed` (the same seed gives the same samples
        here; not ours). The scores are score_batch's, EOS included, as ours."""
        # CTranslate2 seeds a worker thread's generator when the thread starts: a fresh
        # translator after set_random_seed (cheap: the weights are mapped again).
        self.ctranslate2.set_random_seed(seed)
        sampler = self._engine(1, self.workers * self.threads)

        def sample(sources, prefixes):
            # top_k=1 draws the most likely token: CTranslate2 then returns one hypothesis.
            outputs = sampler.translate_batch(
                sources, num_hypotheses=1 if top_k == 1 else num_samples, beam_size=1,
                sampling_topk=top_k, sampling_topp=top_p, sampling_temperature=temperature,
                length_penalty=self.alpha, **self._options(sources, prefixes))
            found = [output.hypotheses for output in outputs]
            pairs = [(row, p) for row, hypotheses in enumerate(found) for p in hypotheses]
            scores = iter(self.score_pieces([sources[row] for row, _ in pairs],
                                            [p for _, p in pairs]))
            # That one hypothesis is scored once and repeated: scored twice in one batch, the
            # rows' sums may differ in the last bits (AVX2 kernels), and samples of a greedy
            # draw are one translation with one score.
            repeat = num_samples if top_k == 1 else 1
            return [[(self.processor.decode(p), float(sum(next(scores)))) for p in hypotheses]
                    * repeat for hypotheses in found]

        return sample

    def _scorer(self):
        def score(sources, targets):
            return [(float(sum(per_token)), len(per_token))
                    for per_token in self.score_pieces(sources, targets)]

        return score

    def _aligner(self):
        def align(sources, targets):
            """Teacher-forced: each target forced as the prefix of a greedy search one token
            longer, whose attention rows for the prefix are the pair's (the rest is left)."""
            from keras_transformer.decoding.search.alignment import ctranslate2_pharaoh

            rows = [i for i, (s, t) in enumerate(zip(sources, targets)) if s and t]
            lines = [""] * len(sources)
            if not rows:
                return lines
            outputs = self.translator.translate_batch(
                [sources[i] for i in rows], target_prefix=[targets[i] for i in rows],
                beam_size=1, max_decoding_length=max(len(targets[i]) for i in rows) + 1,
                max_input_length=0, return_attention=True, max_batch_size=self.batch_size)
            for i, output in zip(rows, outputs):
                lines[i] = ctranslate2_pharaoh(sources[i], targets[i], output.attention[0])
            return lines

        return align

    def score_pieces(self, sources, targets):
        """Forced decoding: per-token log-probabilities of each target (EOS last)."""
        outputs = self.translator.score_batch(sources, targets, max_input_length=0,
                                              max_batch_size=self.batch_size) if sources else []
        return [list(output.log_probs) for output in outputs]
