"""The decoding request: the values a decoding runs with, each option declared once.

A `Request` is values only: frozen, checked when made, knowing no run, no engine and no
framework (Hugging Face's `GenerationConfig` is the model). Each option is declared once
(`option`), with its default, its help, its allowed values (as data: `settings.Range`,
choices), the commands that take it and the search mode it belongs to; everything else is
generated from the declaration:

* the flags of the commands (`cli.flags.add_flags`) and what a command line gave
  (`given_flags`);
* the one check per option (`check`), run when a request is made, by the engines' Python API
  and by the commands before anything loads;
* the SavedModel signature inputs and their defaults (`signature_input`, `DEFAULTS`) and the
  graph checks of the exported signatures (`RANGES`);
* the defaults of a command whose search is another task's (`command_defaults`: parse runs
  the paper's parsing search).

    request = Request(beam_size=5, alpha=1.0)        # InputError names a value out of range
    request.replace(alpha=0.6)                       # a new request, checked again

Where each value came from (a flag, the run's saved choice in decoding.json, a default), the
precision and the engine built from a request belong to the decoder above
(`decoding.decoder.Decoder`), the one way into decoding.
"""

import dataclasses
import typing

from keras_transformer.errors import InputError
from keras_transformer.runs.settings import Range, setting

# The search modes an option belongs to (None: both).
SEARCH, SAMPLE = "search", "sample"
# The commands that decode.
TRANSLATE, EVALUATE, SCORE, ATTENTION, PARSE, EXPORT, DISTILL = (
    "translate", "evaluate", "score", "attention", "parse", "export", "distill")
DECODING = (TRANSLATE, EVALUATE, ATTENTION, PARSE)  # the commands that search
ALL = DECODING + (SCORE,)
SEARCHED = DECODING + (EXPORT, DISTILL)  # the commands that fix a search's beam and alpha
ENGINES = ("tensorflow", "ctranslate2")
# Terminology constraints: the most phrases one sentence may be given (the search's candidates
# grow with them); each phrase is at most the model's longest input in subword tokens.
MAX_CONSTRAINTS = 32
PRECISIONS = ("auto", "float32", "bfloat16")

# The paper's searches. Translation's (Section 6.1: beam 4, alpha 0.6, input + 50; ours: 64
# sentences a batch) are the options' declared defaults; constituency parsing's (Section 6.3:
# beam 21, alpha 0.3, input + 300; 16 sentences a batch, float32: bf16 parsing has not been
# measured against the trees' F1; the exact early stop: the horizon was measured on
# translation only) are parse's.
PARSING = {"beam_size": 21, "alpha": 0.3, "extra_length": 300, "batch_size": 16,
           "precision": "float32", "stop_horizon": 0}
COMMAND_DEFAULTS = {PARSE: PARSING}
# Commands whose flag for an option is not the option's own (distill: the student's settings
# have a --batch-size and a --precision of training).
FLAG_NAMES = {DISTILL: {"batch_size": "--teacher-batch-size",
                        "precision": "--teacher-precision"}}


def option(default, help, *, check=None, choices=None, flag=None, metavar=None,
           commands=DECODING, mode=None, saved=False, engine_option=True, signature=False,
           default_text=None, recorded_if_set=False, said_if_set=False):
    """Declares one decoding option (a field of `Request`).

    Args:
        default, help, check, choices, default_text: as `runs.settings.setting`.
        flag: the command-line flag, if not --NAME (e.g. "--beam").
        metavar: the flag's placeholder in --help.
        commands: the commands that have the flag.
        mode: SEARCH or SAMPLE when the option only applies to that mode.
        saved: the run's decoding choice (decoding.json) may hold it.
        engine_option: an engine must declare it (`Engine.SUPPORTS`) to be asked for it with a
            value other than its default; False for what picks the engine and the model; the
            name of another option for one that asks the engine for that one (a glossary
            makes constraints).
        signature: an input of the exported signatures of its mode (`signature_input`).
        recorded_if_set: a job's record of its request (`recorded`) holds the option only when
            it is not the default (an option added later: older partial outputs resume).
        said_if_set: the decoder's line (`Decoder.describe`) names the option only when it
            is not the default (a control that is off by default).
    """
    field = setting(default, help, choices=choices, check=check, default_text=default_text)
    return dataclasses.field(default=default, metadata={
        **field.metadata, "flag_name": flag, "metavar": metavar, "commands": commands,
        "mode": mode, "saved": saved, "engine_option": engine_option,
        "signature": signature, "recorded_if_set": recorded_if_set,
        "said_if_set": said_if_set})


@dataclasses.dataclass(frozen=True)
class Request:
    """What to decode with: one field per option (see `option`), checked when made."""

    model: typing.Optional[str] = option(
        None, "model file", flag="--model", commands=ALL + (EXPORT,), saved=True, engine_option=False,
        default_text="default: the one chosen for the run, saved in RUN_DIR/decoding.json by "
        "the main job or `average`; else RUN_DIR/averaged.keras if it exists, else "
        "RUN_DIR/model.keras")
    beam_size: int = option(
        4, "beam size (1 = greedy)", check=Range(low=1), flag="--beam", metavar="BEAM",
        commands=SEARCHED, mode=SEARCH, saved=True, signature=True,
        default_text="default: the run's saved choice, else 4")
    alpha: float = option(
        0.6, "length penalty", check=Range(low=0), commands=SEARCHED,
        mode=SEARCH, saved=True,
        signature=True, default_text="default: the run's saved choice, else 0.6")
    extra_length: int = option(
        50, "maximum output length = input length + this",
        check=Range(low=0), commands=())
    stop_horizon: int = option(
        3, "beam search: a sentence stops searching once no alive hypothesis, ending within "
        "this many more steps, could beat its worst finished one",
        check=Range(low=0, note="0: exact, ending anywhere up to the output limit"),
        commands=DECODING + (DISTILL,), mode=SEARCH, recorded_if_set=True,
        default_text="default: 3 (parse: 0)")
    no_repeat_ngram_size: int = option(
        0, "never repeat an n-gram of this many tokens within an output (a target prefix "
        "included): a token that would complete one the output already holds is banned "
        "(fairseq's --no-repeat-ngram-size; a prefix's own tokens and a constraint's are "
        "still written)", check=Range(low=0, note="0: off"), metavar="N",
        commands=(TRANSLATE, EVALUATE), mode=SEARCH, saved=True, signature=True,
        recorded_if_set=True, said_if_set=True,
        default_text="default: the run's saved choice, else 0, off")
    repetition_penalty: float = option(
        1.0, "penalize the tokens an output has already generated: each one's logit z becomes "
        "z / P if positive and z * P if negative, before the softmax (Hugging Face's and "
        "CTranslate2's rule; above 1 discourages repeats)",
        check=Range(low=0, low_open=True, note="1: off"), metavar="P",
        commands=(TRANSLATE, EVALUATE), mode=SEARCH, saved=True, signature=True,
        recorded_if_set=True, said_if_set=True,
        default_text="default: the run's saved choice, else 1.0, off")
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
    constraints: bool = option(
        False, "terminology constraints: each input line is SOURCE<TAB>PHRASE[<TAB>PHRASE...] "
        "and every phrase (target-language words) appears in that line's translation, in any "
        "order (lexically constrained beam search with dynamic beam allocation; output one "
        "line per input line, as without)", commands=(TRANSLATE,), mode=SEARCH,
        default_text="off")
    glossary: typing.Optional[str] = option(
        None, "a terminology file, one 'source term<TAB>target term' per line: a sentence "
        "whose source contains a source term (as whole words) gets its target term as a "
        "constraint (with --constraints, besides the line's own)", metavar="FILE.tsv",
        commands=(TRANSLATE,), mode=SEARCH, engine_option="constraints", default_text="none")
    glossary_ignore_case: bool = option(
        False, "match the glossary's source terms ignoring case", commands=(TRANSLATE,),
        mode=SEARCH, engine_option=False, default_text="off")
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
        commands=(TRANSLATE, EVALUATE, SCORE, ATTENTION, DISTILL))
    batch_size: int = option(
        64, "sentences (score: pairs) per batch", check=Range(low=1),
        commands=ALL + (DISTILL,))
    xla: typing.Optional[bool] = option(
        None, "tensorflow engine: compile the search with XLA (--no-xla: not), on a few batch "
        "shapes, each compiled once per machine (a persistent cache: "
        "$XDG_CACHE_HOME/keras-transformer/xla, KERAS_TRANSFORMER_XLA_CACHE=DIR or off)",
        commands=(TRANSLATE, EVALUATE), mode=SEARCH,
        default_text="default: auto, on where the whole command was measured faster with it "
        "on this CPU class and precision, off elsewhere; the line on standard error says "
        "which and why")
    engine: str = option(
        "tensorflow", "tensorflow: the run's Keras model; ctranslate2: the run's CTranslate2 "
        "export (keras-transformer export --format ctranslate2), whose --alpha divides scores "
        "by length^alpha instead of the GNMT penalty", choices=ENGINES,
        commands=(TRANSLATE, EVALUATE, SCORE), engine_option=False)
    target_language: typing.Optional[str] = option(
        None, "a model trained on several pairs: the language to translate into (its tag goes "
        "in front of each source); a one-pair run needs none", flag="--tgt-lang",
        metavar="LANG", commands=(TRANSLATE, EVALUATE, SCORE, ATTENTION), engine_option=False,
        recorded_if_set=True,
        default_text="default: none; a model of several targets refuses translate without "
        "it, evaluate then scores every pair")
    ctranslate2_model: typing.Optional[str] = option(
        None, "CTranslate2 export folder for --engine ctranslate2", metavar="FOLDER",
        commands=(TRANSLATE, EVALUATE, SCORE), engine_option=False,
        default_text="default: the run's export in saved_models/RUN_NAME/, ctranslate2-int8 "
        "(what demo and export write) first, else ctranslate2 (float32); the line on "
        "standard error says which and why")
    workers: typing.Optional[int] = option(
        None, "ctranslate2 engine: searches run at once, each on its own worker (CTranslate2's "
        "inter_threads; the workers share one copy of the weights)", check=Range(low=1),
        commands=(TRANSLATE, EVALUATE, SCORE), recorded_if_set=True,
        default_text="default: one per core with --threads 1, the fastest setting measured on "
        "the 2-core machines (docs/performance.md)")
    threads: typing.Optional[int] = option(
        None, "ctranslate2 engine: threads of each worker (CTranslate2's intra_threads)",
        check=Range(low=1), commands=(TRANSLATE, EVALUATE, SCORE), recorded_if_set=True,
        default_text="default: 1, or the cores divided among the --workers given")


    def __post_init__(self):
        check(self.values())
        if (self.constraints or self.glossary) and self.beam_size < 2 and not self.sample:
            raise InputError(f"constraints need beam search: use a beam of 2 or more (the "
                             f"beam is {self.beam_size}).")
        hints = typing.get_type_hints(type(self))
        for name in fields():  # a whole number given for a float option
            if hints[name] is float and isinstance(getattr(self, name), int):
                object.__setattr__(self, name, float(getattr(self, name)))

    @classmethod
    def defaults(cls, command=TRANSLATE):
        """The request of `command` when nothing is given (parse: the parsing search)."""
        return cls(**command_defaults(command))

    def replace(self, **changes):
        """A copy with some values changed (checked again)."""
        return dataclasses.replace(self, **changes)

    def values(self):
        """{option: value} of every option."""
        return {name: getattr(self, name) for name in fields()}

    def recorded(self):
        """{option: value} as a job records its request (`jobs.streaming.job_identity`):
        every option, less those `recorded_if_set` at their default."""
        return {name: value for name, value in self.values().items()
                if not (fields()[name]["recorded_if_set"]
                        and value == fields()[name]["default"])}

    @property
    def mode(self):
        return SAMPLE if self.sample else SEARCH

    def applies(self, name, command=TRANSLATE):
        """Whether option `name` applies to this request's mode and to `command`."""
        meta = fields()[name]
        return meta["mode"] in (None, self.mode) and (
            not meta["commands"] or command in meta["commands"])

    def sampling(self):
        """{option: value} of the sampling options (`Engine.sample`'s keywords)."""
        return {name: getattr(self, name) for name in SAMPLING}

    def engine_options(self, command=TRANSLATE):
        """{option: value} of the engine options this request asks for with a value other
        than the default, in its mode: what the engine must support."""
        asked = {}
        for name, meta in fields().items():
            if meta["engine_option"] and self.applies(name, command) \
                    and getattr(self, name) != meta["default"]:
                option = name if meta["engine_option"] is True else meta["engine_option"]
                asked.setdefault(option, getattr(self, name))
        return asked


def _declared():
    return dataclasses.fields(Request)


SAMPLING = tuple(f.name for f in _declared() if f.metadata["mode"] == SAMPLE)
DEFAULTS = {f.name: f.default for f in _declared()}
RANGES = {f.name: f.metadata["check"] for f in _declared()
          if isinstance(f.metadata["check"], Range)}


def fields():
    """{option: its metadata}, in declaration order (read at each call: a test may add an
    option to `Request`)."""
    return {f.name: {**f.metadata, "default": f.default} for f in dataclasses.fields(Request)}


def command_defaults(command):
    """{option: value} where `command`'s default is not the declared one."""
    return dict(COMMAND_DEFAULTS.get(command, {}))


def flag_name(name, command=None):
    """The flag of option `name` (on `command`'s command line)."""
    renamed = FLAG_NAMES.get(command, {}).get(name)
    return renamed or fields()[name]["flag_name"] or "--" + name.replace("_", "-")


def flag_dest(name, command=None):
    """Where argparse keeps option `name`'s flag: the option's name, unless `command` renames
    the flag (distill's --teacher-batch-size: teacher_batch_size)."""
    renamed = FLAG_NAMES.get(command, {}).get(name)
    return renamed[2:].replace("-", "_") if renamed else name


def given_flags(args, command):
    """{option: value} of the flags of `command` given on its command line (argparse's
    `args`). Refuses, naming the flag, a value out of range and an option of the other mode
    (--top-k without --sample, --beam with it), before anything is loaded."""
    given = {name: getattr(args, flag_dest(name, command))
             for name, meta in fields().items() if command in meta["commands"]
             and getattr(args, flag_dest(name, command), None) is not None}
    check_modes(given, command)
    check(given, flags=True, command=command)
    return given


def check(values, flags=False, command=None):
    """The one check of decoding options: each of `values` ({option: value}) of its declared
    type, among its choices and in its range. InputError names every option out of bounds,
    as the Python API spells it (`top_k=-1 must be at least 0 (0: no top-k cut)`) or, with
    `flags`, as `command`'s command line does (`--top-p 1.5 must be ...`)."""
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
        said = f"{flag_name(name, command)} {value}" if flags else f"{name}={value!r}"
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


def check_modes(given, command=None):
    """Refuses a sampling option without --sample, and a search option with it."""
    declared = fields()
    if not given.get("sample"):
        for name in given:
            if declared[name]["mode"] == SAMPLE:
                raise InputError(f"{flag_name(name, command)} is for --sample (sampling "
                                 "instead of beam search): add --sample or leave it out.")
        return
    for name, value in given.items():
        if declared[name]["mode"] == SEARCH and value not in (False, None):
            raise InputError(f"{flag_name(name, command)} is for beam search, not --sample "
                             "(which draws each token): leave it out, or use --num-samples N "
                             "for several outputs per line.")


def signature_input(name):
    """(dtype name, default) of option `name` as an input of the exported signatures: int32
    or float32 scalars."""
    kind = typing.get_type_hints(Request)[name]
    return ("int32" if kind is int else "float32"), DEFAULTS[name]
