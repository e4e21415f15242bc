"""The engines a server holds and what a batch of calls asks of them.

The main engine is the run's CTranslate2 export (`--engine ctranslate2`) or its Keras model
(`--engine keras`, float32 without XLA: the SavedModel's search, the same answers); a
CTranslate2 server also holds the Keras engine (unless `--no-keras-fallback`) for what
CTranslate2 lacks: lexical constraints. Both are built by the decoder
(`decoding.decoder.Decoder`), the one way into decoding. A search with other options than the
run's (beam, alpha, repetition controls) is the same CTranslate2 engine, its workers shared
(`CTranslate2Translator.searching_with`), or a Keras engine of its own on the one model, kept
among the last few used.

Calls batch together when they share a `batch_key`: the engine, what they compute and their
search; a batch's lines go to the engine's text layer in one call (sorted by length and
batched there, onto CTranslate2's workers), and each call gets its own lines' results back.
Sampling calls run one at a time, alone: a seed gives the same samples.
"""

import collections
import itertools
import threading

from keras_transformer.decoding.decoder import Decoder
from keras_transformer.decoding.request import TRANSLATE
from keras_transformer.errors import InputError
from keras_transformer.serving.errors import ServingError
from keras_transformer.serving.signatures import NBEST, SAMPLE, SCORE, SEARCH

CTRANSLATE2, KERAS = "ctranslate2", "tensorflow"  # the request's names of the engines
KEPT_KERAS_SEARCHES = 8  # Keras engines of other searches than the run's, the last used
WARM_UP_SENTENCE = "A short sentence warms the engine up ."
# The score of a hypothesis an n-best list lacks (an empty line has one): the SavedModel's
# score of a beam that never lived, so that both answer the same rectangle.
MISSING_SCORE = -1e9


class Engines:
    """The engines of a run.

    Args:
        decoder: the run's decoder (`Decoder.resolve`) of the main engine: its request's
            engine ("ctranslate2" or "tensorflow"), export, workers and threads.
        keras_fallback: also hold the Keras engine, for the calls CTranslate2 cannot search.
    """

    def __init__(self, decoder, keras_fallback=True):
        self.decoder, self.main = decoder, decoder.request.engine
        self.fallback = keras_fallback and self.main == CTRANSLATE2
        self.base, self.model = {}, None
        self._kept = collections.OrderedDict()
        self._lock, self._sampling = threading.Lock(), threading.Lock()
        self._count = itertools.count()

    @property
    def names(self):
        return [self.main] + ([KERAS] if self.fallback else [])

    def load(self):
        """Builds the engines (the Keras model loaded once); returns self."""
        if self.main == CTRANSLATE2:
            self.base[CTRANSLATE2] = self.decoder.engine()
        if self.main == KERAS or self.fallback:
            import keras_transformer

            keras_transformer.register()  # the saved classes the run's model names
            request = self.decoder.request.replace(engine=KERAS, precision="float32",
                                                   xla=False)
            keras = Decoder(request, self.decoder.run, command=TRANSLATE)
            self.model = keras.load_model()
            self.base[KERAS] = keras.engine(model=self.model)
        return self

    def describe(self, folder=True):
        """What searches, in words (with the CTranslate2 export's folder, or not: the page
        names no path of the server's)."""
        if self.main == KERAS:
            return "the Keras engine (float32, the SavedModel's search)"
        line = "CTranslate2" + (f" ({self.decoder.ctranslate2_folder()})" if folder else "")
        engine = self.base.get(CTRANSLATE2)
        if engine is not None:
            line += (f", {engine.workers} worker{'s' * (engine.workers > 1)} x "
                     f"{engine.threads} thread{'s' * (engine.threads > 1)}")
        return line + ("; constraints on the Keras engine" if self.fallback
                       else "; no Keras engine: constraints refused")

    # -- which engine, which batch -----------------------------------------------------------
    def engine_name(self, call):
        """The engine that computes `call`: the main one, or the Keras one for constraints
        on a CTranslate2 server (refused by name without it)."""
        constrained = any(c.strip() for c in call.values.get("constraints", ()))
        if constrained and self.main == CTRANSLATE2:
            if not self.fallback:
                raise ServingError.invalid(
                    "constraints: the ctranslate2 engine does not support constraints, and "
                    "this server holds no Keras engine (started with --no-keras-fallback); "
                    "leave them out, or start serve without --no-keras-fallback.")
            return KERAS
        return self.main

    def batch_key(self, call):
        """Calls of one key are searched together (a target language the run lacks is
        refused here, by name, before the call joins a batch)."""
        name = self.engine_name(call)
        try:
            for language in set(call.languages() or ()):
                self.decoder.languages().check(language, "target_language")
        except InputError as error:
            raise ServingError.invalid(str(error)) from None
        if call.kind == SAMPLE:
            return (name, SAMPLE, next(self._count))  # alone
        if call.kind == SCORE:
            return (name, SCORE)
        return (name, call.kind, *sorted(call.search().items()))

    # -- searching ---------------------------------------------------------------------------
    def run(self, key, calls):
        """Each call's outputs ({output: one value per line}) of a batch of one key, or the
        ServingError of a call the engine refuses (a phrase it cannot write): such a batch
        is searched again call by call, so that only that call is refused."""
        try:
            return self._run(key, calls)
        except InputError as error:
            if len(calls) == 1:
                return [ServingError.invalid(str(error))]
        return [self.run(key, [call])[0] for call in calls]

    def _run(self, key, calls):
        name, kind = key[0], key[1]
        if kind == SAMPLE:
            with self._sampling:  # one at a time: CTranslate2's seed is the process's
                return [self._sample(self.base[name], calls[0])]
        if kind == SCORE:
            return self._score(self.base[name], calls)
        return self._translate(self._searching(name, calls[0]), kind, calls)

    def _searching(self, name, call):
        """The engine of `name` searching with `call`'s options."""
        search, base = call.search(), self.base[name]
        if search == {option: getattr(self.decoder.request, option) for option in search}:
            return base  # the run's own search
        request = self.decoder.request.replace(engine=name, **search)
        if name == CTRANSLATE2:
            return base.searching_with(request)
        key = tuple(sorted(search.items()))
        with self._lock:
            if key not in self._kept:
                keras = Decoder(request.replace(precision="float32", xla=False),
                                self.decoder.run, command=TRANSLATE)
                self._kept[key] = keras.engine(model=self.model)
                while len(self._kept) > KEPT_KERAS_SEARCHES:
                    self._kept.popitem(last=False)
            self._kept.move_to_end(key)
            return self._kept[key]

    @staticmethod
    def _translate(engine, kind, calls):
        sentences = [s for call in calls for s in call.values["sentences"]]
        options = dict(prefixes=_joined(calls, "prefixes", ""),
                       constraints=_joined(calls, "constraints", "", _phrases),
                       target_language=_languages(calls))
        if options["constraints"] is not None and not any(options["constraints"]):
            options["constraints"] = None
        if kind == SEARCH:
            found = engine.translate(sentences, scores=True, **options)
            return [{"translations": [t for t, _ in part], "scores": [s for _, s in part]}
                    for part in _split(found, calls)]
        found = engine.translate(sentences, nbest=True, **options)
        outputs = []
        for call, part in zip(calls, _split(found, calls)):
            count = call.values["num_hypotheses"] if kind == NBEST else None
            rows = [_padded(hypotheses, count) for hypotheses in part]
            outputs.append({"translations": [[t for t, _ in row] for row in rows],
                            "scores": [[s for _, s in row] for row in rows]})
        return outputs

    @staticmethod
    def _sample(engine, call):
        values = call.values
        prefixes = values["prefixes"] or None
        found = engine.sample(values["sentences"], prefixes=prefixes,
                              target_language=call.languages(),
                              **{name: values[name] for name in (
                                  "num_samples", "top_k", "top_p", "temperature", "seed")})
        rows = [_padded(samples, values["num_samples"]) for samples in found]
        return {"translations": [[t for t, _ in row] for row in rows],
                "scores": [[s for _, s in row] for row in rows]}

    @staticmethod
    def _score(engine, calls):
        found = engine.score([s for call in calls for s in call.values["sources"]],
                             [t for call in calls for t in call.values["targets"]],
                             target_language=_languages(calls))
        return [{"log_prob": [r["log_prob"] for r in part],
                 "tokens": [r["tokens"] for r in part], "mean": [r["mean"] for r in part]}
                for part in _split(found, calls)]

    def warm_up(self):
        """One search, n-best list and score on each engine (a constrained search on the
        Keras one), so that the first clients find them built."""
        for name, engine in self.base.items():
            engine.translate([WARM_UP_SENTENCE], scores=True)
            engine.translate([WARM_UP_SENTENCE], nbest=True)
            engine.score([WARM_UP_SENTENCE], [WARM_UP_SENTENCE])
            if name == KERAS:
                engine.translate([WARM_UP_SENTENCE], constraints=[[WARM_UP_SENTENCE.split()[1]]])


def _joined(calls, name, empty, convert=lambda value: value):
    """The calls' values of a per-sentence input, one list (`empty` for a call without
    any), converted; None when no call gives any."""
    if not any(call.values.get(name) for call in calls):
        return None
    joined = []
    for call in calls:
        joined += call.values.get(name) or [empty] * call.lines
    return [convert(value) for value in joined]


def _phrases(constraints):
    """A sentence's constraints input (phrases separated by tabs) as a list of phrases."""
    return [phrase for phrase in constraints.split("\t") if phrase.strip()]


def _languages(calls):
    """Each line's target language (None: a one-pair run)."""
    if calls[0].languages() is None:
        return None
    return [language for call in calls for language in call.languages()]


def _split(results, calls):
    """The results of the calls' lines, one list per call."""
    parts, start = [], 0
    for call in calls:
        parts.append(results[start: start + call.lines])
        start += call.lines
    return parts


def _padded(hypotheses, count):
    """`count` hypotheses (all with None), ("", MISSING_SCORE) after the last (an empty line
    has one): the answer is a rectangle, as the signature's."""
    hypotheses = list(hypotheses)
    if count is None:
        return hypotheses
    return (hypotheses + [("", MISSING_SCORE)] * count)[:count]
