"""The decoder: the one way into decoding, for every command and every Python caller.

A `Request` (decoding/request.py) is values only. The decoder holds one with everything around
it: where each value came from (a flag, the run's saved choice, a value given in Python, the
default), the run it decodes and that run's saved choice (decoding.json: read here, and written
only through `Decoder.save_choice`), the precision the Keras engine computes in, the line on
standard error saying all that (`describe`), and the engine, built by that engine's own
`from_request`.

    decoder = Decoder.from_flags(args, "translate")  # a flag > the run's choice > the default
    print(decoder.describe(), file=sys.stderr)
    engine = decoder.engine()                         # a Translator or a CTranslate2 engine

    Decoder.resolve(run, {"beam_size": 1}).engine()  # a Python caller's values (GIVEN)
    Decoder(Request(beam_size=4)).engine(model, vocabulary, max_input_length)  # a model in memory
    greedy_translator(model, vocabulary, max_input_length)  # the same with beam 1 (dev BLEU)
    Decoder.save_choice(run, alpha=1.0, chosen_by="the main job, on val")

The Keras engine's modules (the Translator, precision, XLA) are imported when a request for it
is resolved: a decoder of the CTranslate2 engine imports neither TensorFlow nor Keras.
"""

import pathlib

from keras_transformer.decoding.engines.ctranslate2 import (CTranslate2Translator,
                                                           default_threading)
from keras_transformer.decoding.engines.languages import TargetLanguages
from keras_transformer.decoding import request as declared
from keras_transformer.decoding.request import (
    ATTENTION, EVALUATE, EXPORT, PARSE, SAMPLE, SCORE, SEARCH, TRANSLATE, check,
    command_defaults, fields, given_flags)
from keras_transformer.defaults import ctranslate2_folder

# The run's CTranslate2 exports the engine takes without --ctranslate2-model, first found first:
# int8, the export's default and what `demo` writes, then float32 and the other quantizations.
CTRANSLATE2_PREFERENCE = (("int8", "int8"), ("none", "float32"),
                          ("int8_float32", "int8_float32"), ("float16", "float16"))
from keras_transformer.errors import InputError
from keras_transformer.runs import EnsembleRun, open_run
from keras_transformer.runs.settings import DEFAULT, FLAG, GIVEN, RUN

# Commands that decode with the run's saved choice (decoding.json). Parse does not: the saved
# beam and alpha were chosen for translation, and parsing has its own search.
READS_CHOICE = frozenset((TRANSLATE, EVALUATE, SCORE, ATTENTION, EXPORT))


class Decoder:
    """A request, where its values came from, and what it decodes.

    Args:
        request: the values (default: `command`'s defaults).
        run: the `Run` (or `EnsembleRun`) decoded; None for a model in memory
            (`engine(model, tokenizer, max_input_length)`).
        sources: {option: FLAG, RUN or GIVEN} of the values that are not defaults.
        command: the command decoding (its flags, its defaults, the verb of `describe`).
        choice: the run's saved choice as read (its "weights" and "chosen_by" are said).
    """

    def __init__(self, request=None, run=None, sources=None, command=TRANSLATE, choice=None):
        self.request = request if request is not None else declared.Request.defaults(command)
        self.run, self.command = run, command
        self.sources = dict(sources or {})
        self.choice = dict(choice or {})
        self._precision = self._xla = None

    # -- building ----------------------------------------------------------------------------
    @classmethod
    def from_flags(cls, args, command, run=None):
        """The decoder of a command's parsed flags: each flag given, else the run's saved
        choice, else the default. The flags are checked before the run (`--run-dir`, or
        `run`) is opened."""
        given = given_flags(args, command)
        return cls.resolve(run if run is not None else open_run(args.run_dir), given, FLAG,
                           command)

    @classmethod
    def resolve(cls, run=None, given=None, source=GIVEN, command=TRANSLATE):
        """A decoder of `given` values ({option: value}, from `source`: FLAG or GIVEN), the
        rest from the run's saved choice where it holds them, else `command`'s defaults."""
        given = dict(given or {})
        check(given)  # an unknown option named, before anything is read
        saved = run.decoding() if run is not None and command in READS_CHOICE else {}
        values, sources = dict(given), dict.fromkeys(given, source)
        for name, meta in fields().items():
            if name not in values and meta["saved"] and saved.get(name) is not None:
                values[name], sources[name] = saved[name], RUN
        try:
            check({name: values[name] for name, where in sources.items() if where == RUN})
        except InputError as error:  # a saved value out of range: the file is named
            raise InputError(f"{run.decoding_path}: {error}") from None
        # The declaration's Request (a test may extend it), checked as a whole.
        request = declared.Request(**{**command_defaults(command), **values})
        decoder = cls(request, run, sources, command, saved)
        if command in (TRANSLATE, EVALUATE, SCORE, ATTENTION):  # the commands of --tgt-lang
            decoder.languages()  # a language the run lacks refused by name, before loading
        return decoder

    @staticmethod
    def save_choice(run, **choices):
        """Writes the run's decoding choice (decoding.json; this is its one writer): the
        options marked `saved` are checked as any request's, then `Run.save_decoding` merges
        them into the file atomically. Returns the merged choices."""
        options = {name: value for name, value in choices.items() if name in fields()}
        if options:
            request = declared.Request(**options)  # checked, a whole alpha made a float
            choices.update({name: getattr(request, name) for name in options})
        return run.save_decoding(**choices)

    # -- what decodes ------------------------------------------------------------------------
    def source(self, name):
        return self.sources.get(name, DEFAULT)

    @property
    def chosen_by(self):
        """Who saved the run's choice, when a value came from it."""
        return self.choice.get("chosen_by")

    def model_file(self):
        """The model file to load (None: the run loads its own, e.g. an ensemble's members)
        and the source of that choice."""
        if self.sources.get("model") in (FLAG, GIVEN):
            return pathlib.Path(self.request.model), self.sources["model"]
        run = self.run
        if run is None or isinstance(run, EnsembleRun):
            return None, DEFAULT
        path = run.decoding_model_path() if self.command in READS_CHOICE else run.model_file()
        saved = self.request.model is not None and path.name == self.request.model
        return path, RUN if saved else DEFAULT

    def ctranslate2_folder(self):
        """The CTranslate2 folder the engine loads (`ctranslate2_choice`)."""
        return self.ctranslate2_choice()[0]

    def ctranslate2_choice(self):
        """(folder, why): the CTranslate2 export the request names, else the run's preferred
        one in the default place (`run_ctranslate2_exports`: int8 first, as `demo` and `export
        --format ctranslate2` write it), else where that int8 one would be."""
        if self.request.ctranslate2_model:
            return pathlib.Path(self.request.ctranslate2_model), "--ctranslate2-model"
        found = self.run_ctranslate2_exports()
        if not found:
            return ctranslate2_folder(self.run.directory, "int8"), "the run's default place"
        (folder, label), others = found[0], [label for _, label in found[1:]]
        why = f"the run's {label} export" + (
            f", preferred over its {', '.join(others)} one" if others else "")
        return folder, why + "; --ctranslate2-model picks another"

    def run_ctranslate2_export(self):
        """The run's preferred CTranslate2 export in the default place, or None."""
        found = self.run_ctranslate2_exports()
        return found[0][0] if found else None

    def run_ctranslate2_exports(self):
        """[(folder, label)] of the run's CTranslate2 exports in the default place, in the
        order the engine prefers them: int8 (what `demo` and `export --format ctranslate2`
        write), float32, int8_float32, float16."""
        if self.run is None:
            return []
        found = []
        for quantize, label in CTRANSLATE2_PREFERENCE:
            folder = ctranslate2_folder(self.run.directory, quantize)
            if (folder / "model.bin").is_file():
                found.append((folder, label))
        return found

    def load_model(self):
        """The model of the run this decoder decodes with (an ensemble's: its members')."""
        return self.run.load_model(path=self.model_file()[0])

    @property
    def precision(self):
        """(dtype, reason) the Keras engine computes in (`engines.precision`); (None, None)
        for another engine."""
        if self.request.engine != "tensorflow":
            return None, None
        if self._precision is None:
            from keras_transformer.decoding.engines.precision import resolve_precision

            self._precision = resolve_precision(self.request.precision)
        return self._precision

    @property
    def xla(self):
        """(on, reason): whether the Keras engine compiles the search with XLA
        (`engines.xla`: a flag, else auto for this CPU class and precision); (None, None)
        for another engine."""
        if self.request.engine != "tensorflow":
            return None, None
        if self._xla is None:
            from keras_transformer.decoding.engines.xla import resolve_xla

            self._xla = resolve_xla(self.request.xla, self.precision[0])
        return self._xla

    def languages(self):
        """The `TargetLanguages` the engine translates into: the run's, the request's
        target_language its default (a model in memory: tagged as the request asks). A run of
        several targets refuses, naming them, a command that translates one stream of
        sentences (translate, score, attention) without a target."""
        language = self.request.target_language
        if self.run is None or not self.run.is_run():  # (a run is refused when it loads)
            return TargetLanguages(default=language)
        languages = TargetLanguages.of_config(self.run.config, language)
        if languages.several and language is None and self.command in (
                TRANSLATE, SCORE, ATTENTION, PARSE):
            languages.tags(0)  # the refusal that names the choices
        return languages

    def engine(self, model=None, tokenizer=None, max_input_length=None):
        """The engine the request asks for, through that engine's own `from_request`, every
        option it asks for checked against what the engine supports. The Keras engine
        searches `model` (default: the run's, `load_model`) with `tokenizer` and inputs
        truncated at `max_input_length` (defaults: the run's)."""
        request = self.request
        if request.engine == "ctranslate2":
            folder = self.ctranslate2_folder()
            CTranslate2Translator.refuse_unsupported(request.engine_options(self.command))
            if not folder.is_dir():
                raise InputError(f"No CTranslate2 export at {folder}: run keras-transformer "
                                 f"export --run-dir {self.run.directory} --format ctranslate2 "
                                 "first (or give --ctranslate2-model).")
            return CTranslate2Translator.from_request(request, folder, self.command) \
                .set_languages(self.languages())
        from keras_transformer.decoding.engines.translator import Translator

        Translator.refuse_unsupported(request.engine_options(self.command))
        if model is None:
            model = self.load_model()
        return Translator.from_request(
            request, model, tokenizer if tokenizer is not None else self.run.vocabulary(),
            max_input_length or self.run.config.max_length, self.command,
            precision=self.precision, xla=self.xla).set_languages(self.languages())

    # -- the line on standard error -----------------------------------------------------------
    def describe(self):
        """One line: what decodes, each value and where it came from when not the default
        (in brackets, as the training settings' effective config), e.g. "decoding with
        averaged.keras (average of the last 5 checkpoints) [run]: beam_size 4 [run], alpha
        1.0 [run], precision bfloat16, batch_size 64, xla off [auto: not measured faster on
        the avx512_bf16 class in bfloat16 (--xla forces it)], engine tensorflow; run: chosen
        by the main job, on val (a flag overrides it); bf16: this CPU has avx512_bf16;
        --precision float32 restores float32"."""
        request, command = self.request, self.command
        if request.engine == "ctranslate2":
            folder, why = self.ctranslate2_choice()
            label = f"the CTranslate2 export {folder} [{why}]"
        else:
            path, source = self.model_file()
            label = str(path) if source in (FLAG, GIVEN) else (
                path.name if path is not None else "the members' models")
            if source == RUN and self.choice.get("weights"):
                label += f" ({self.choice['weights']})"
            if source != DEFAULT:
                label += f" [{source}]"
        precision, reason = (self.precision if request.applies("precision", command)
                             else (None, None))
        engine = CTranslate2Translator if request.engine == "ctranslate2" else None
        threading = {} if engine is None else dict(zip(
            ("workers", "threads"), default_threading(request.workers, request.threads)))
        items = []
        for name, meta in fields().items():
            if name in ("model", "ctranslate2_model", "prefixes") or not meta["commands"] \
                    or not request.applies(name, command):
                continue
            value = precision if name == "precision" and precision else getattr(request, name)
            if value is None and name in threading:  # CTranslate2's chosen setting
                value = threading[name]
            if name == "xla" and request.engine == "tensorflow":
                on, why = self.xla  # always said, with its reason when auto chose it
                source = self.sources.get(name)
                items.append(f"xla {'on' if on else 'off'} [{source or why}]")
                continue
            if value is None or value is False or (name == "precision" and not precision) or (
                    meta["said_if_set"] and value == meta["default"]) or (
                    engine is not None and meta["engine_option"] is True
                    and name not in engine.SUPPORTS):
                continue  # off switches, and what another engine does not compute
            source = self.sources.get(name)
            items.append(f"{name} {value}" + (f" [{source}]" if source else ""))
        verb = {SCORE: "scoring", EXPORT: "exporting", PARSE: "parsing"}.get(
            command, {SEARCH: "decoding", SAMPLE: "sampling"}[request.mode])
        line = f"{verb} with {label}: {', '.join(items)}"
        if RUN in self.sources.values():
            line += (f"; run: chosen by {self.chosen_by or 'an earlier command'}"
                     " (a flag overrides it)")
        line += f"; {reason}" if reason else ""
        if request.engine == "tensorflow" and command in (TRANSLATE, EVALUATE):
            export = self.run_ctranslate2_export()
            if export is not None:  # the faster lane on a CPU, where the run has one
                line += (f"; this run has a CTranslate2 export, {export}: --engine "
                         "ctranslate2 translates with it, several times faster on a CPU")
        return line


def greedy_translator(model, tokenizer, max_input_length):
    """The Keras engine that translates with `model` in memory by greedy search (beam 1), every
    other value the default: what training's dev BLEU and the main job's choice of weights on
    val decode with."""
    return Decoder(declared.Request(beam_size=1)).engine(model, tokenizer, max_input_length)
