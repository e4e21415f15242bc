"""The decoding request: every decoding option declared once, with its default, its help, its
allowed values (as data: `settings.Range`, choices), the commands that take it and the search
mode it belongs to. Everything else is generated from the declaration:

* the flags of `translate`, `evaluate`, `score`, `attention` and `parse` (`cli.flags.add_flags`);
* the one check per option (`check`), called by the engines' Python API and by the commands;
* the SavedModel signature inputs and their defaults (`signature_input`, `DEFAULTS`) and the
  graph checks of the exported signatures (`RANGES`);
* the line on standard error saying which values decode and where each came from
  (`Request.describe`), in the provenance vocabulary of the training settings
  (`runs.settings`: flag, run, given, default);
* the run's saved choice (decoding.json, `Run.decoding()`): read as the `run` source of the
  options marked `saved`, and written through `save_choice`.

    request = Request.from_flags(args, "translate").with_run()  # flag > run's choice > default
    engine = request.build_engine()                  # a Translator or a CTranslate2 engine
    print(request.describe(), file=sys.stderr)

No TensorFlow here: building the parser stays fast.
"""

import dataclasses
import pathlib
import typing

from keras_transformer.defaults import TRANSLATION, ctranslate2_folder
from keras_transformer.errors import InputError
from keras_transformer.runs.settings import DEFAULT, FLAG, GIVEN, RUN, Range, Section, setting

# The search modes an option belongs to (None: both).
SEARCH, SAMPLE = "search", "sample"
# The commands that decode.
TRANSLATE, EVALUATE, SCORE, ATTENTION, PARSE, EXPORT = (
    "translate", "evaluate", "score", "attention", "parse", "export")
DECODING = (TRANSLATE, EVALUATE, ATTENTION, PARSE)  # the commands that search
ALL = DECODING + (SCORE,)
SEARCHED = DECODING + (EXPORT,)  # the commands that fix a search's beam and alpha
ENGINES = ("tensorflow", "ctranslate2")
PRECISIONS = ("auto", "float32", "bfloat16")


def option(default, help, *, check=None, choices=None, flag=None, metavar=None,
           commands=DECODING, mode=None, saved=False, engine_option=True, signature=False,
           default_text=None):
    """Declares one decoding option (a field of `Request`).

    Args:
        default, help, check, choices, default_text: as `runs.settings.setting`.
        flag: the command-line flag, if not --NAME (e.g. "--beam").
        metavar: the flag's placeholder in --help.
        commands: the commands that have the flag.
        mode: SEARCH or SAMPLE when the option only applies to that mode.
        saved: the run's decoding choice (decoding.json) may hold it.
        engine_option: an engine must declare it (`Engine.SUPPORTS`) to be asked for it with a
            value other than its default; False for what picks the engine and the model.
        signature: an input of the exported signatures of its mode (`signature_input`).
    """
    field = setting(default, help, choices=choices, check=check, default_text=default_text)
    return dataclasses.field(default=default, metadata={
        **field.metadata, "flag_name": flag, "metavar": metavar, "commands": commands,
        "mode": mode, "saved": saved, "engine_option": engine_option,
        "signature": signature})


@dataclasses.dataclass
class Request(Section):
    """What to decode with: one field per option (see `option`)."""

    model: typing.Optional[str] = option(
        None, "model file", flag="--model", commands=ALL + (EXPORT,), saved=True, engine_option=False,
        default_text="default: the one chosen for the run, saved in RUN_DIR/decoding.json by "
        "the main job or `average`; else RUN_DIR/averaged.keras if it exists, else "
        "RUN_DIR/model.keras")
    beam_size: int = option(
        TRANSLATION.beam_size, "beam size (1 = greedy)", check=Range(low=1), flag="--beam", metavar="BEAM",
        commands=SEARCHED, mode=SEARCH, saved=True, signature=True,
        default_text=f"default: the run's saved choice, else {TRANSLATION.beam_size}")
    alpha: float = option(
        TRANSLATION.alpha, "length penalty", check=Range(low=0), commands=SEARCHED,
        mode=SEARCH, saved=True,
        signature=True, default_text=f"default: the run's saved choice, else {TRANSLATION.alpha}")
    extra_length: int = option(
        TRANSLATION.extra_length, "maximum output length = input length + this",
        check=Range(low=0), commands=())
    nbest: bool = option(
        False, "print every beam hypothesis as: line, score, text (line: the input line's "
        "number from 0; score: the hypothesis' score, length-penalized log-probability), "
        "tab-separated", commands=(TRANSLATE,), mode=SEARCH, default_text="off")
    prefixes: typing.Optional[str] = option(
        None, "target prefixes, line-aligned with the input: each translation starts with its "
        "line's prefix and the search goes on after it (an empty line: no prefix)",
        flag="--prefix", metavar="FILE", commands=(TRANSLATE,), default_text="none")
    sample: bool = option(
        False, "sample instead of beam search: draw each token from the model's distribution "
        "(beam, alpha and --nbest do not apply); the same command and --seed give the same "
        "output, resumed or not", commands=(TRANSLATE,), default_text="off")
    top_k: int = option(
        0, "draw among the k most likely tokens only", check=Range(low=0, note="0: no top-k cut"),
        commands=(TRANSLATE,), mode=SAMPLE, signature=True)
    top_p: float = option(
        1.0, "draw among the most likely tokens whose probabilities add up to p (nucleus "
        "sampling)", check=Range(0, 1, low_open=True, note="1: no nucleus cut"),
        commands=(TRANSLATE,), mode=SAMPLE, signature=True)
    temperature: float = option(
        1.0, "divide the logits by this (lower: closer to greedy)",
        check=Range(low=0, low_open=True), commands=(TRANSLATE,), mode=SAMPLE,
        signature=True)
    seed: int = option(
        0, "random seed", check=Range(0, 2 ** 31, high_open=True), commands=(TRANSLATE,),
        mode=SAMPLE, signature=True)
    num_samples: int = option(
        1, "samples per input line; more than 1 prints line, log-probability, text per "
        "sample, as --nbest", check=Range(low=1), commands=(TRANSLATE,), mode=SAMPLE,
        signature=True)
    alignments: bool = option(
        False, "add each sentence's word alignment in Pharaoh format (source-target word "
        "index pairs from 0, words being the whitespace-separated tokens of the input and "
        "the output line) after a tab; score: of the given pair; evaluate: in a file beside "
        "the hypotheses; export: an `alignments` output of serving_default and "
        "translate_nbest", commands=(TRANSLATE, EVALUATE, SCORE, EXPORT), mode=SEARCH,
        default_text="off")
    precision: str = option(
        "auto", "what the search computes in: auto is bfloat16 on CPUs with bf16 units "
        "(AMX, AVX-512 BF16: faster there, the same output on most sentences) and float32 "
        "elsewhere; the exports stay float32", choices=PRECISIONS,
        commands=(TRANSLATE, EVALUATE, SCORE, ATTENTION))
    batch_size: int = option(
        TRANSLATION.batch_size, "sentences (score: pairs) per batch", check=Range(low=1),
        commands=ALL)
    xla: bool = option(
        False, "tensorflow engine: compile the search with XLA (1.3-1.4x faster per batch on "
        "CPU, after a compilation of seconds for each batch shape; worth it for large inputs)",
        commands=(TRANSLATE, EVALUATE), mode=SEARCH, default_text="off")
    engine: str = option(
        "tensorflow", "tensorflow: the run's Keras model; ctranslate2: the run's CTranslate2 "
        "export (keras-transformer export --format ctranslate2), whose --alpha divides scores "
        "by length^alpha instead of the GNMT penalty", choices=ENGINES,
        commands=(TRANSLATE, EVALUATE, SCORE), engine_option=False)
    ctranslate2_model: typing.Optional[str] = option(
        None, "CTranslate2 export folder for --engine ctranslate2", metavar="FOLDER",
        commands=(TRANSLATE, EVALUATE, SCORE), engine_option=False,
        default_text="default: saved_models/RUN_NAME/ctranslate2; e.g. "
        "saved_models/RUN_NAME/ctranslate2-int8 for the int8 one")

    def validate(self):
        check({name: getattr(self, name) for name in fields()})
        hints = typing.get_type_hints(Request)
        for name in fields():  # a whole number given for a float option
            if hints[name] is float and isinstance(getattr(self, name), int):
                setattr(self, name, float(getattr(self, name)))

    # -- building ----------------------------------------------------------------------------
    @classmethod
    def from_flags(cls, args, command):
        """The request of a command's parsed flags (those given; `with_run` adds the run's
        choice). Refuses, naming the flag, a value out of range and an option of the other
        mode (--top-k without --sample, --beam with it), before anything is loaded."""
        given = {name: getattr(args, name) for name, meta in fields().items()
                 if command in meta["commands"] and getattr(args, name, None) is not None}
        check_modes(given)
        check(given, flags=True)
        request = cls(**given)
        request.__dict__.update(_given=given, _sources=dict.fromkeys(given, FLAG),
                                _command=command, _run_dir=getattr(args, "run_dir", None))
        return request

    def with_run(self, run=None):
        """This request for `run` (default: the flags' --run-dir, opened here; an ensemble's
        directory too): each option given stays, the options marked `saved` come from the
        run's decoding choice where it holds them, the rest are the defaults."""
        if run is None:
            from keras_transformer.runs import open_run

            run = open_run(self.__dict__["_run_dir"])
        given = self.__dict__.get("_given", {})
        source = FLAG if FLAG in self.sources.values() else GIVEN
        return type(self).resolve(given, source, run, self.command)

    @classmethod
    def resolve(cls, given, source=GIVEN, run=None, command=TRANSLATE):
        """A request of `given` values (their source: FLAG or GIVEN), the rest from the run's
        saved choice (decoding.json) where it holds them, else the defaults."""
        saved = run.decoding() if run is not None else {}
        values, sources = dict(given), {name: source for name in given}
        for name, meta in fields().items():
            if name not in values and meta["saved"] and saved.get(name) is not None:
                values[name], sources[name] = saved[name], RUN
        try:
            request = cls(**values)
        except InputError as error:  # a saved value out of range: the file is named
            where = run.decoding_path if run is not None else "decoding.json"
            raise InputError(f"{where}: {error}") from None
        request.__dict__.update(_given=dict(given), _sources=sources, _command=command,
                                _run=run, _chosen_by=saved.get("chosen_by"),
                                _weights=saved.get("weights"))
        return request

    @property
    def command(self):
        return self.__dict__.get("_command", TRANSLATE)

    @property
    def run(self):
        """The run decoded (None before `with_run`)."""
        return self.__dict__.get("_run")

    @property
    def resolved_precision(self):
        """What the Keras engine computes in ("float32", "bfloat16"; None before
        `build_engine`, or for another engine)."""
        return self.__dict__.get("_precision", (None, None))[0]

    def values(self):
        """{option: value} of every option."""
        return {name: getattr(self, name) for name in fields()}

    @property
    def sources(self):
        """{option: FLAG, RUN or GIVEN}; options at their default are absent."""
        return self.__dict__.get("_sources", {})

    def source(self, name):
        return self.sources.get(name, DEFAULT)

    @property
    def mode(self):
        return SAMPLE if self.sample else SEARCH

    def applies(self, name, command=None):
        """Whether option `name` applies to this request's mode (and to `command`)."""
        meta = fields()[name]
        command = command or self.command
        return meta["mode"] in (None, self.mode) and (
            not meta["commands"] or command in meta["commands"])

    def sampling(self):
        """{option: value} of the sampling options (`Engine.sample`'s keywords)."""
        return {name: getattr(self, name) for name in SAMPLING}

    def engine_options(self):
        """{option: value} of the engine options this request asks for with a value other
        than the default, in its mode: what the engine must support."""
        return {name: getattr(self, name) for name, meta in fields().items()
                if meta["engine_option"] and self.applies(name)
                and getattr(self, name) != meta["default"]}

    # -- the model and the engine ------------------------------------------------------------
    def model_file(self):
        """The model file to load (None: the run loads its own, e.g. an ensemble's members)
        and the source of that choice."""
        run = self.run
        if self.sources.get("model") in (FLAG, GIVEN):
            return pathlib.Path(self.model), self.sources["model"]
        path = run.decoding_model_path() if run is not None else None
        saved = self.model is not None and path is not None and path.name == self.model
        return path, RUN if saved else DEFAULT

    def ctranslate2_folder(self):
        return pathlib.Path(self.ctranslate2_model or ctranslate2_folder(self.run.directory))

    def build_engine(self, run=None):
        """The engine this request asks for, built for `run`, with every option it asks for
        checked against what the engine supports (`Engine.refuse_unsupported`)."""
        run = run if run is not None else self.run
        if self.engine == "ctranslate2":
            from keras_transformer.decoding.ctranslate2 import CTranslate2Translator as Engine
        else:
            from keras_transformer.decoding.translate import Translator as Engine
        Engine.refuse_unsupported(self.engine_options())
        if self.engine == "ctranslate2":
            folder = self.ctranslate2_folder()
            if not folder.is_dir():
                raise InputError(f"No CTranslate2 export at {folder}: run keras-transformer "
                                 f"export --run-dir {run.directory} --format ctranslate2 first "
                                 "(or give --ctranslate2-model).")
            self.__dict__["_label"] = f"the CTranslate2 export {folder}"
            return Engine(folder, beam_size=self.beam_size, alpha=self.alpha,
                          batch_size=self.batch_size, extra_length=self.extra_length)
        engine = Engine.from_run(run, self.model_file()[0], beam_size=self.beam_size,
                                 alpha=self.alpha, batch_size=self.batch_size,
                                 extra_length=self.extra_length, jit_compile=self.xla,
                                 precision=self.precision)
        self.__dict__["_precision"] = (engine.precision, engine.precision_reason)
        return engine

    # -- the line on standard error -----------------------------------------------------------
    def describe(self):
        """One line: what decodes, each value and where it came from when not the default
        (in brackets, as the training settings' effective config), e.g. "decoding with
        averaged.keras (average of the last 5 checkpoints) [run]: beam_size 4 [run], alpha
        1.0 [run], batch_size 64, precision bfloat16, engine tensorflow; run: chosen by the
        main job, on val; bf16: this CPU has avx512_bf16; --precision float32 restores
        float32". Call after `build_engine()`, which resolves the precision."""
        command = self.command
        label = self.__dict__.get("_label")
        if label is None:
            path, source = self.model_file()
            label = str(path) if source in (FLAG, GIVEN) else (
                path.name if path is not None else "the members' models")
            if source == RUN and self.__dict__.get("_weights"):
                label += f" ({self.__dict__['_weights']})"
            if source != DEFAULT:
                label += f" [{source}]"
        precision, reason = self.__dict__.get("_precision", (None, None))
        items = []
        for name, meta in fields().items():
            if name in ("model", "ctranslate2_model", "prefixes") or not meta["commands"] \
                    or not self.applies(name, command):
                continue
            value = precision if name == "precision" and precision else getattr(self, name)
            if value is None or value is False or (name == "precision" and self.engine != "tensorflow"):
                continue  # off switches, and what another engine does not compute
            source = self.sources.get(name)
            items.append(f"{name} {value}" + (f" [{source}]" if source else ""))
        verb = {SCORE: "scoring", EXPORT: "exporting"}.get(
            command, {SEARCH: "decoding", SAMPLE: "sampling"}[self.mode])
        line = f"{verb} with {label}: {', '.join(items)}"
        if RUN in self.sources.values():
            line += (f"; run: chosen by {self.__dict__.get('_chosen_by') or 'an earlier command'}"
                     " (a flag overrides it)")
        return line + (f"; {reason}" if reason else "")


SAMPLING = tuple(name for name, meta in ((f.name, f.metadata)
                                         for f in dataclasses.fields(Request))
                 if meta["mode"] == SAMPLE)
DEFAULTS = {f.name: f.default for f in dataclasses.fields(Request)}
RANGES = {f.name: f.metadata["check"] for f in dataclasses.fields(Request)
          if isinstance(f.metadata["check"], Range)}


def fields():
    """{option: its metadata}, in declaration order (read at each call: a test may add an
    option to `Request`)."""
    return {f.name: {**f.metadata, "default": f.default} for f in dataclasses.fields(Request)}


def flag_name(name):
    return fields()[name]["flag_name"] or "--" + name.replace("_", "-")


def check(values, flags=False):
    """The one check of decoding options: each of `values` ({option: value}) of its declared
    type, among its choices and in its range. InputError names every option out of bounds,
    as the Python API spells it (`top_k=-1 must be at least 0 (0: no top-k cut)`) or, with
    `flags`, as the command line does (`--top-p 1.5 must be ...`)."""
    declared, hints = fields(), typing.get_type_hints(Request)
    problems = []
    for name, value in values.items():
        if name not in declared:
            raise InputError(f"unknown decoding option {name!r}; the options are "
                             f"{', '.join(declared)}.")
        if value is None:
            continue
        meta, kind = declared[name], hints[name]
        kind = typing.get_args(kind)[0] if typing.get_origin(kind) is typing.Union else kind
        said = f"{flag_name(name)} {value}" if flags else f"{name}={value!r}"
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            problems.append(f"{said} must be an integer")
        elif kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            problems.append(f"{said} must be a number")
        elif kind in (bool, str) and not isinstance(value, kind):
            problems.append(f"{said} must be {'true or false' if kind is bool else 'a text'}")
        elif meta["choices"] and value not in meta["choices"]:
            problems.append(f"{said} must be one of {', '.join(meta['choices'])}")
        elif meta["check"] and meta["check"](value):
            problems.append(f"{said} {meta['check'](value)}")
    if problems:
        raise InputError("; ".join(problems) + ".")


def check_modes(given):
    """Refuses a sampling option without --sample, and a search option with it."""
    declared = fields()
    if not given.get("sample"):
        for name in given:
            if declared[name]["mode"] == SAMPLE:
                raise InputError(f"{flag_name(name)} is for --sample (sampling instead of beam "
                                 "search): add --sample or leave it out.")
        return
    for name, value in given.items():
        if declared[name]["mode"] == SEARCH and value not in (False, None):
            raise InputError(f"{flag_name(name)} is for beam search, not --sample (which draws "
                             "each token): leave it out, or use --num-samples N for several "
                             "outputs per line.")


def signature_input(name):
    """(dtype name, default) of option `name` as an input of the exported signatures: int32
    or float32 scalars."""
    kind = typing.get_type_hints(Request)[name]
    return ("int32" if kind is int else "float32"), DEFAULTS[name]


def save_choice(run, **choices):
    """Writes the run's decoding choice (decoding.json) through the request: the values of
    the options marked `saved` checked as any request's, then `Run.save_decoding`."""
    check({name: value for name, value in choices.items() if name in fields()})
    return run.save_decoding(**choices)
