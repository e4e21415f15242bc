"""The engine interface: one text layer over every decoding engine.

An engine translates, samples and scores text. What is the same for every engine lives here,
once: lines are whitespace-normalized, an empty line gives an empty result without a search,
prefixes are checked (one per sentence) and encoded, sentences are sorted by length and
batched, results come back in input order as strings, (text, score) n-best lists or score
dicts, and the options are checked against the decoding request's declaration
(`decoding.request.check`). An engine overrides only the id-level methods:

    encode(sentences)            -> source rows (ids or pieces), truncated, as the engine wants
    encode_targets(sentences)    -> target rows without EOS (prefixes, scored targets;
                                    normalized by the text layer, not truncated)
    _batch_key(source, prefix)   -> (group, order): sentences batch together within a group,
                                    sorted by order (default: one group, by source length);
                                    a searcher or sampler with a `batch_key` attribute of
                                    the same kind is batched by that instead
    _searcher(nbest, alignments) -> f(sources, prefixes[, constraints]) -> [[(text, score),
                                    ...] per row] (with alignments: (text, score, Pharaoh
                                    string) triples); constraints, passed only when asked
                                    for: per row a list of phrases' target rows
    _sampler(**sampling)         -> the same for random samples
    _scorer()                    -> f(sources, targets) -> [(log_prob, tokens) per row]
    _aligner()                   -> f(sources, targets) -> [Pharaoh string per row]
                                    (teacher-forced: `score(..., alignments=True)`)

An engine declares what it supports beyond the text layer in `SUPPORTS` (names of the
request's options); asking for an option it lacks is refused by name in one place,
`refuse_unsupported`. Lexical constraints (the `constraints` option,
`decoding.search.constraints`): phrases each translation must contain, checked and encoded
here like prefixes. Word alignments (the `alignments` option, `decoding.search.alignment`): an
engine that declares them returns, from its searcher, (text, score, alignment) triples, and
from `_aligner` the teacher-forced alignment of given pairs; an empty line's alignment is "".
"""

import collections
from concurrent.futures import ThreadPoolExecutor

from keras_transformer.decoding.engines.languages import TargetLanguages
from keras_transformer.decoding.request import DEFAULTS, MAX_CONSTRAINTS, SAMPLING, check
from keras_transformer.errors import InputError
from pipelines.special_ids import UNK_ID
from pipelines.vocabulary import normalize_whitespace


class Engine:
    """The text layer; subclasses implement the id-level methods (see the module doc).

    Attributes:
        NAME: the engine's name ("tensorflow", "ctranslate2").
        SUPPORTS: the request's engine options this engine takes with a non-default value.
        batch_size: sentences per batch.
    """

    NAME = "engine"
    SUPPORTS = frozenset()
    batch_size = DEFAULTS["batch_size"]
    # Batches searched at once, each in a thread of its own (`in_order`): an engine whose
    # searches leave cores idle between their ops (TensorFlow's step-by-step graphs) sets more
    # than one; the results are the same, in the same order.
    in_flight = 1
    # A searcher with a `submit` attribute (an engine whose workers take batches of their
    # own: CTranslate2's asynchronous translate_batch) is given batches without threads of
    # ours, this many queued before the first result is waited for (`submitted_in_order`).
    submitted_ahead = 64
    # The same for sampling: an engine whose random stream is one per worker, consumed in the
    # order batches arrive, samples one batch at a time (the same seed, the same samples).
    samples_in_flight = None  # None: in_flight
    # File-level jobs (`jobs.streaming`): sentences per window, in batches (sorted by length
    # within it; None: `streaming.WINDOW_BATCHES`), and windows decoded at once (2: the next
    # starts before the last one's tail ends, for an engine whose workers would otherwise wait
    # at each window's end).
    window_batches = None
    windows_in_flight = 1
    # The target languages of a run of several pairs (`engines.languages`): each source gets
    # its target's tag. A one-pair run's engine has none and translates as it always did.
    languages = TargetLanguages()

    def set_languages(self, languages):
        """Sets the run's `TargetLanguages` (its targets and the default one); returns self."""
        self.languages = languages
        return self

    def tagged(self, sentences, target_language=None):
        """The sentences as the model reads them: behind their target's tag in a run of
        several targets (`engines.languages`), as they are otherwise."""
        return _tagged(sentences, self.languages.tags(len(sentences), target_language))

    @classmethod
    def refuse_unsupported(cls, options):
        """Refuses, naming them, the options ({name: value}) this engine does not support."""
        lacking = [name for name in options if name not in cls.SUPPORTS]
        if lacking:
            other = "" if cls.NAME == "tensorflow" else "; the tensorflow engine does"
            raise InputError(f"the {cls.NAME} engine does not support "
                             f"{', '.join(lacking)} yet{other}.")

    # -- the Python API ------------------------------------------------------------------------
    def translate(self, sentences, nbest=False, progress=None, prefixes=None, alignments=False,
                  constraints=None, target_language=None, scores=False):
        """Translates a list of strings; returns strings (or, with nbest, lists of
        (translation, score) pairs, best first). Empty inputs give empty outputs.

        prefixes: None, or one string per sentence ("" for none): that sentence's output
        starts with the prefix's subword tokens and the search continues after them; the
        prefix's log-probabilities count in the score.
        alignments: also the word alignment of each translation, a Pharaoh string ("0-0 2-1":
            source word - target word, from 0; "" for an empty line): (translation,
            alignment) pairs instead of strings, or with nbest (translation, score,
            alignment) triples, every hypothesis aligned (`decoding.search.alignment`).
        constraints: None, or one list of phrase strings per sentence ([] for none): every
            translation of that sentence contains each phrase's subword tokens as a
            contiguous run, in any order (lexically constrained beam search,
            `decoding.search.constraints`; a beam of 2 or more). A translation that could not
            fit them before its length limit comes last, behind those that did.
        target_language: a run of several pairs: the language to translate into ("fr"), or
            one per sentence (default: the engine's, `set_languages`); a one-pair run takes
            None or its own target.
        scores: (translation, score) pairs instead of strings, the best hypothesis' score
            (what the SavedModel's serving_default answers); not with alignments.
        """
        options = {"nbest": bool(nbest), "prefixes": prefixes is not None,
                   "alignments": bool(alignments), "constraints": constraints is not None}
        self.refuse_unsupported([name for name, asked in options.items() if asked])
        empty = ("", 0.0, "") if alignments else ("", 0.0)
        tags = self.languages.tags(len(sentences), target_language)
        results = self._run(sentences, prefixes, self._searcher(nbest, alignments), progress,
                            empty, constraints, tags)
        if alignments and tags is not None:  # the tag is no word of the user's source
            results = [[(r[0], r[1], self.languages.untag_alignment(r[2])) for r in hypotheses]
                       for hypotheses in results]
        if nbest:
            return results
        if alignments:
            return [(r[0][0], r[0][2]) for r in results]
        return [r[0][:2] for r in results] if scores else [r[0][0] for r in results]

    def sample(self, sentences, prefixes=None, progress=None, target_language=None,
               **sampling):
        """Random samples instead of the search's best: per sentence a list of num_samples
        (translation, log P(translation | sentence)) pairs, drawn from the model's
        distribution narrowed to its top_k tokens (0: all) and to the smallest set holding
        top_p of the probability (1: all), at `temperature`, from `seed` (the defaults and
        ranges: `decoding.request`). Empty inputs give [("", 0.0)]."""
        self.refuse_unsupported(["sample"] + (["prefixes"] if prefixes is not None else []))
        unknown = sorted(set(sampling) - set(SAMPLING))
        if unknown:
            raise InputError(f"unknown sampling option(s) {unknown}; the options are "
                             f"{', '.join(SAMPLING)}.")
        sampling = {name: sampling.get(name, DEFAULTS[name]) for name in SAMPLING}
        check(sampling)
        return self._run(sentences, prefixes, self._sampler(**sampling), progress,
                         tags=self.languages.tags(len(sentences), target_language),
                         in_flight=self.samples_in_flight)

    def score(self, sources, targets, progress=None, alignments=False, target_language=None):
        """log P(target | source) of each pair: a list of dicts {"log_prob": natural-log
        total, "tokens": subword tokens of the target with its EOS, "mean": log_prob /
        tokens}, in the order given, batched by length. With `alignments`, each dict also
        has "alignment": the pair's word alignment, teacher-forced (the given target, not a
        search), a Pharaoh string ("" when either side is empty)."""
        self.refuse_unsupported(["score"] + (["alignments"] if alignments else []))
        if len(sources) != len(targets):
            raise InputError(f"score needs one target per source: {len(sources)} sources, "
                             f"{len(targets)} targets.")
        tags = self.languages.tags(len(sources), target_language)
        encoded = self.encode(_tagged([_normalized(s) for s in sources], tags)) if sources \
            else []
        target_rows = self.encode_targets(_normalized_targets(targets)) if targets else []
        order = sorted(range(len(sources)),
                       key=lambda i: (len(encoded[i]), len(target_rows[i])))
        scorer, results = self._scorer(), [None] * len(sources)
        aligner = self._aligner() if alignments else None
        for start in range(0, len(order), self.batch_size):
            chunk = order[start: start + self.batch_size]
            pairs = [encoded[i] for i in chunk], [target_rows[i] for i in chunk]
            found = scorer(*pairs)
            for i, (total, tokens) in zip(chunk, found):
                results[i] = {"log_prob": total, "tokens": tokens, "mean": total / tokens}
            if aligner is not None:
                for i, line in zip(chunk, aligner(*pairs)):
                    results[i]["alignment"] = (line if tags is None
                                               else self.languages.untag_alignment(line))
            if progress is not None:
                progress.update(len(chunk))
        return results

    # -- the text layer ----------------------------------------------------------------------
    def _run(self, sentences, prefixes, decode_batch, progress, empty=("", 0.0),
             constraints=None, tags=None, in_flight=None):
        """Per sentence, the hypotheses `decode_batch` finds, in input order; [empty] for
        an empty sentence, which is not decoded. A batch whose sentences have phrases
        (`constraints`) gets them as its third argument. `tags`: a run of several pairs:
        each sentence's target tag, put in front of it (an empty one stays empty).
        `in_flight`: batches decoded at once (default: the engine's `in_flight`)."""
        sentences = _tagged([_normalized(s) for s in sentences], tags)
        prefix_rows = self._prefix_rows(sentences, prefixes)
        phrase_rows = self._phrase_rows(sentences, constraints)
        results = [[empty] if not s else None for s in sentences]
        todo = [i for i, s in enumerate(sentences) if s]
        encoded = dict(zip(todo, self.encode([sentences[i] for i in todo]))) if todo else {}
        key = getattr(decode_batch, "batch_key", self._batch_key)  # a searcher's own rule
        keys = {i: key(encoded[i], prefix_rows and prefix_rows[i]) for i in todo}
        order = sorted(todo, key=lambda i: keys[i])
        chunks = list(self._chunks(order, keys))

        def inputs(chunk):
            given = [[encoded[i] for i in chunk],
                     None if prefix_rows is None else [prefix_rows[i] for i in chunk]]
            if phrase_rows is not None and any(phrase_rows[i] for i in chunk):
                given.append([phrase_rows[i] for i in chunk])
            return given

        submit = getattr(decode_batch, "submit", None)  # an engine with workers of its own
        if submit is not None:
            # Its workers get the longest batches first and end on short ones, together; in
            # the other order one of them ends on the longest batch while the others wait
            # (test2016, CTranslate2 at 2 workers: 1.70 -> 1.56 s for the whole command).
            chunks.reverse()
        found_batches = (submitted_in_order(submit, map(inputs, chunks), self.submitted_ahead)
                         if submit is not None else
                         in_order(decode_batch, map(inputs, chunks), in_flight or self.in_flight))
        for chunk, found in zip(chunks, found_batches):
            for i, hypotheses in zip(chunk, found):
                results[i] = hypotheses
            if progress is not None:
                progress.update(len(chunk))
        return results

    def _prefix_rows(self, sentences, prefixes):
        """The prefixes' rows (None when no sentence has one)."""
        if prefixes is None:
            return None
        if len(prefixes) != len(sentences):
            raise InputError(f"prefixes must give one string per sentence: {len(sentences)} "
                             f"sentences, {len(prefixes)} prefixes.")
        if not any(p and p.strip() for p in prefixes):
            return None
        return self.encode_targets(_normalized_targets(prefixes))

    def _phrase_rows(self, sentences, constraints):
        """The constraints' rows: per sentence a list of phrases' target rows (None when
        there are no constraints)."""
        if constraints is None:
            return None
        if len(constraints) != len(sentences):
            raise InputError(f"constraints must give one list of phrases per sentence: "
                             f"{len(sentences)} sentences, {len(constraints)} lists.")
        for number, phrases in enumerate(constraints):
            if isinstance(phrases, str) or not all(isinstance(p, str) for p in phrases):
                raise InputError(f"the constraints of sentence {number} must be a list of "
                                 f"strings, not {phrases!r}.")
            if not all(p.strip() for p in phrases):
                raise InputError(f"the constraints of sentence {number} hold an empty "
                                 f"phrase: {list(phrases)!r}.")
            if len(phrases) > MAX_CONSTRAINTS:
                raise InputError(f"sentence {number} has {len(phrases)} constraint phrases: "
                                 f"at most {MAX_CONSTRAINTS} may be given to one sentence.")
        flat = [p for phrases in constraints for p in phrases]
        encoded = self.encode_targets(_normalized_targets(flat)) if flat else []
        longest = getattr(self, "max_input_length", None)
        for phrase, row in zip(flat, encoded):
            if longest is not None and len(row) > longest:
                raise InputError(f"the constraint phrase {phrase!r} has {len(row)} subword "
                                 f"tokens: at most {longest} (the model's longest input).")
            if UNK_ID in row:
                raise InputError(f"the constraint phrase {phrase!r} holds a piece the model's "
                                 "vocabulary does not know (the unknown piece): it cannot be "
                                 "written; rephrase it.")
        rows = iter(encoded)
        return [[next(rows) for _ in phrases] for phrases in constraints]

    def _chunks(self, order, keys):
        """Up to batch_size consecutive sentences of `order` that share a group."""
        chunk = []
        for i in order:
            if chunk and (len(chunk) == self.batch_size or keys[i][0] != keys[chunk[0]][0]):
                yield chunk
                chunk = []
            chunk.append(i)
        if chunk:
            yield chunk

    # -- id level: what an engine overrides ----------------------------------------------------
    def encode(self, sentences):
        raise NotImplementedError

    def encode_targets(self, sentences):
        raise NotImplementedError

    def _batch_key(self, source, prefix):
        return 0, len(source)

    def _searcher(self, nbest, alignments=False):
        raise NotImplementedError

    def _sampler(self, **sampling):
        raise NotImplementedError

    def _scorer(self):
        raise NotImplementedError

    def _aligner(self):
        raise NotImplementedError


def _normalized(text):
    return normalize_whitespace(text.rstrip("\n"))


def _tagged(sentences, tags):
    """Each non-empty sentence behind its tag (None: as they are)."""
    if tags is None:
        return sentences
    return [f"{tag} {s}" if s else s for s, tag in zip(sentences, tags)]


def _normalized_targets(sentences):
    """Target lines (prefixes, scored targets) normalized; "" for an empty or missing one."""
    return [_normalized(s) if s else "" for s in sentences]


def submitted_in_order(submit, argument_lists, ahead):
    """The results of the calls `submit(*arguments)` starts, one per list, in their order:
    `submit` queues a call with an engine's own workers and returns a function of no
    arguments that waits for its result. Up to `ahead` calls wait in the queue behind the
    one whose result is awaited, so that the workers never wait on this thread (no thread of
    ours, no lock taken while they search: a result is turned into Python objects only when
    it is collected). The lists are read as the calls are queued."""
    pending = collections.deque()
    for arguments in argument_lists:
        pending.append(submit(*arguments))
        if len(pending) > ahead:
            yield pending.popleft()()
    while pending:
        yield pending.popleft()()


def in_order(function, argument_lists, workers):
    """function(*arguments) of each list, in their order, with up to `workers` calls running
    at once (threads; one: in this thread, one after the other), the lists read as the calls
    start. The first call that raises ends the map: the calls not yet started are cancelled
    and its error is raised."""
    if workers <= 1:
        yield from (function(*arguments) for arguments in argument_lists)
        return
    pool = ThreadPoolExecutor(workers, thread_name_prefix="search")
    try:
        pending = []
        for arguments in argument_lists:
            pending.append(pool.submit(function, *arguments))
            if len(pending) == workers:  # at most `workers` batches' inputs held at once
                yield pending.pop(0).result()
        for future in pending:
            yield future.result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
