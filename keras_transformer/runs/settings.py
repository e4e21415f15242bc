"""Settings declared once: a field of a settings section carries its default, its help, its
allowed values, its check and whether a resumed run may change it. Everything else is
generated from those declarations: command-line flags, config-file keys (sectioned or flat),
validation, the printed effective config and the saved document.

    @dataclasses.dataclass
    class DataSettings(Section):
        vocab_size: int = setting(8000, "shared subword vocabulary size", check=positive)

A section is a dataclass of settings; a config (`Settings`) is a dataclass whose fields are
sections. A value of None means "not set here": the config fills it (from a preset, say) when
it is resolved, and says where each value came from.
"""

import argparse
import dataclasses
import typing

from keras_transformer.errors import ConfigError

# Where a value came from, for the effective config of training and for the decoding request
# (`decoding.request`): one vocabulary. A value with no entry is the default (DEFAULT). RUN: the
# run's own saved value (its config when resumed, its decoding choice in decoding.json); GIVEN:
# an argument of a Python call.
FLAG, FILE, PRESET, RUN, GIVEN, DEFAULT = "flag", "file", "preset", "run", "given", "default"


def setting(default, help, *, choices=None, check=None, resumable=False, location=False,
            flag=True, prepare=False, default_text=None, many=False, saved_if=None):
    """Declares one setting (a dataclass field of a section).

    Args:
        default: the value when nothing sets it; None means "filled when the config is
            resolved" (say from what in `default_text`).
        help: one line for `--help`.
        choices: the allowed values, if they are a short list.
        check: a function (value) -> None or the rule it breaks ("must be positive"); it is
            not called for None.
        resumable: a resumed run may change it (steps, checkpoints, logging).
        location: where the run or its data is, not what it is (a moved run is the same run).
        flag: whether `train` has a command-line flag for it.
        prepare: whether `prepare` (the data preparation command) reads it too.
        default_text: what `--help` says of the default, where the value does not say it.
        many: the value may also be a list of such values (one per language pair: the flag
            takes several, `--tgt-lang de fr`); a list of one is that one value, so a config
            of one pair reads and saves as it did before lists existed.
        saved_if: a function (section) -> bool: the saved document holds the setting only
            when it is not the default or this says so (a setting added after runs were saved,
            that leaves their files as they were where it does not apply).
    """
    return dataclasses.field(default=default, metadata=dict(
        help=help, choices=choices, check=check, resumable=resumable, location=location,
        flag=flag, prepare=prepare, default_text=default_text, many=many,
        saved_if=saved_if))


# Checks shared by many settings.
def positive(value):
    return None if value > 0 else "must be positive"


def non_negative(value):
    return None if value >= 0 else "must be at least 0"


def fraction(value):
    return None if 0.0 <= value < 1.0 else "must be in [0, 1)"


@dataclasses.dataclass(frozen=True)
class Range:
    """An allowed interval as data, usable as a setting's `check`: the Python check, the rule
    said in messages and the graph checks of an export are all made from it.

        Range(0, 2, low_open=True)       # in (0, 2]
        Range(low=1)                     # at least 1

    Args:
        low, high: the bounds (None: unbounded on that side).
        low_open, high_open: the bound itself is excluded.
        note: what a special value means, said after the rule (e.g. "0: no top-k cut").
    """

    low: typing.Optional[float] = None
    high: typing.Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    note: str = ""

    def holds(self, value):
        """Whether `value` is inside (NaN never is)."""
        if self.low is not None and not (value > self.low if self.low_open
                                         else value >= self.low):
            return False
        if self.high is not None and not (value < self.high if self.high_open
                                          else value <= self.high):
            return False
        return True

    def rule(self):
        """The rule in words: "at least 1", "above 0", "in (0, 2]"."""
        low, high = _number(self.low), _number(self.high)
        if self.high is None:
            text = f"above {low}" if self.low_open else f"at least {low}"
        elif self.low is None:
            text = f"below {high}" if self.high_open else f"at most {high}"
        else:
            text = (f"in {'(' if self.low_open else '['}{low}, "
                    f"{high}{')' if self.high_open else ']'}")
        return text + (f" ({self.note})" if self.note else "")

    def __call__(self, value):
        return None if self.holds(value) else "must be " + self.rule()


def _number(value):
    """A bound as people write it: 2**31 rather than 2147483648."""
    if isinstance(value, int) and value >= 1 << 16 and value & (value - 1) == 0:
        return f"2**{value.bit_length() - 1}"
    return str(value)


def _base_type(annotation):
    """(type, optional) of a field annotation such as int or Optional[int]."""
    if typing.get_origin(annotation) is typing.Union:
        return typing.get_args(annotation)[0], True
    return annotation, False


@dataclasses.dataclass
class Section:
    """A group of settings. Subclasses declare fields with `setting(...)`."""

    def __post_init__(self):
        self.validate()

    @classmethod
    def declarations(cls):
        """[(field, type, optional)] of the section's settings."""
        hints = typing.get_type_hints(cls)
        return [(field, *_base_type(hints[field.name])) for field in dataclasses.fields(cls)]

    def validate(self):
        """Type, allowed values and check of every field; ConfigError names key and value."""
        for field, kind, optional in self.declarations():
            value = getattr(self, field.name)
            if value is None:
                if optional:
                    continue
                raise ConfigError(f"Config key {field.name!r} must be set; got null.")
            if field.metadata["many"] and isinstance(value, (list, tuple)):
                value = self._many(field, kind, value)
                if isinstance(value, list):
                    continue
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
                setattr(self, field.name, value)
            problem = _value_problem(field, kind, value, " or null" if optional else "")
            if problem:
                raise ConfigError(f"Config key {field.name!r} {problem}; got {value!r}.")

    def _many(self, field, kind, values):
        """A list given to a setting that takes one value per pair: each item checked as the
        value would be; a list of one becomes that value (set on the section, returned)."""
        values = list(values)
        if not values:
            raise ConfigError(f"Config key {field.name!r} is an empty list: give one value "
                              "per language pair.")
        for item in values:
            problem = _value_problem(field, kind, item)
            if problem:
                raise ConfigError(f"Config key {field.name!r}: each value {problem}; got "
                                  f"{item!r} in {values!r}.")
        value = values[0] if len(values) == 1 else values
        setattr(self, field.name, value)
        return value


def _value_problem(field, kind, value, or_null=""):
    """What is wrong with one value of a setting (its type, choices and rule), or None."""
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        return f"must be {kind.__name__}{or_null}"
    choices = field.metadata["choices"]
    if choices is not None and value not in choices:
        return f"must be one of {', '.join(map(str, choices))}"
    return (field.metadata["check"] and field.metadata["check"](value)) or None


@dataclasses.dataclass
class Settings:
    """A config: one field per section. Subclasses declare `section: SectionClass =
    dataclasses.field(default_factory=SectionClass)` fields. A setting reads as
    `config.data.vocab_size` or, its name being unique, `config.vocab_size`."""

    FORMAT_VERSION: typing.ClassVar[int] = 1
    _keys: typing.ClassVar[typing.Optional[dict]] = None

    @classmethod
    def sections(cls):
        """{section name: section class}."""
        hints = typing.get_type_hints(cls)
        return {field.name: hints[field.name] for field in dataclasses.fields(cls)}

    @classmethod
    def keys(cls):
        """{setting name: (section name, field, type, optional)} over all sections."""
        if cls.__dict__.get("_keys") is None:
            cls._keys = cls._collect_keys()
        return cls._keys

    @classmethod
    def _collect_keys(cls):
        keys = {}
        for section, kind in cls.sections().items():
            for field, base, optional in kind.declarations():
                if field.name in keys:
                    raise TypeError(f"setting {field.name!r} is declared in two sections")
                keys[field.name] = (section, field, base, optional)
        return keys

    def __getattr__(self, name):
        # Only called when normal lookup fails: a setting by its (unique) name.
        if name.startswith("_") or name not in type(self).keys():
            raise AttributeError(f"{type(self).__name__} has no setting {name!r}")
        return getattr(getattr(self, type(self).keys()[name][0]), name)

    @property
    def sources(self):
        """{setting name: where its value came from}; settings left at their default are
        absent."""
        if "_sources" not in self.__dict__:
            self.__dict__["_sources"] = {}
        return self.__dict__["_sources"]

    # -- building -----------------------------------------------------------------------------
    @classmethod
    def from_values(cls, values, sources=None):
        """A config from {setting: value} (flat) and where each came from."""
        keys = cls.keys()
        unknown = sorted(set(values) - set(keys))
        if unknown:
            raise ConfigError(f"Unknown config key(s): {', '.join(map(repr, unknown))}. Known "
                              f"keys: {', '.join(keys)}.")
        grouped = {name: {} for name in cls.sections()}
        for key, value in values.items():
            grouped[keys[key][0]][key] = value
        config = cls(**{name: kind(**grouped[name])
                        for name, kind in cls.sections().items()})
        config.sources.update(sources or {})
        return config

    @classmethod
    def flatten(cls, document, where="config"):
        """{setting: value} from a document of sections ({"data": {...}}) or flat keys (or
        both), refusing unknown sections and keys by name."""
        keys, sections = cls.keys(), cls.sections()
        flat = {}
        for key, value in document.items():
            if key in sections and isinstance(value, dict):
                for name, item in value.items():
                    if name not in keys or keys[name][0] != key:
                        raise ConfigError(f"{where}: unknown key {name!r} in section {key!r}. "
                                          f"Its keys: {', '.join(_section_keys(cls, key))}.")
                    flat[name] = item
            elif key in keys:
                flat[key] = value
            else:
                raise ConfigError(f"{where}: unknown config key {key!r}. Sections: "
                                  f"{', '.join(sections)}; keys: {', '.join(keys)}.")
        return flat

    def values(self):
        """{setting: value}, flat."""
        return {key: getattr(getattr(self, section), key)
                for key, (section, *_) in type(self).keys().items()}

    def replaced(self, **values):
        """A copy with some settings changed (sources kept, the changed ones as given)."""
        config = type(self).from_values({**self.values(), **values}, dict(self.sources))
        return config

    # -- output ---------------------------------------------------------------------------------
    def to_dict(self):
        """The document saved in a run: the format version and one mapping per section."""
        document = {"format_version": self.FORMAT_VERSION}
        for name, kind in self.sections().items():
            section = getattr(self, name)
            values = dataclasses.asdict(section)
            for field, _, _ in kind.declarations():
                saved_if = field.metadata["saved_if"]
                if saved_if and values[field.name] == field.default and not saved_if(section):
                    del values[field.name]
            document[name] = values
        return document

    def describe(self, width=100):
        """The effective config, short: a line (wrapped) per section, each value with where it
        came from when that is not the default."""
        lines = ["effective config (in brackets where a value came from; the rest are "
                 "defaults):"]
        for name in self.sections():
            items = []
            for field, _, _ in type(self).sections()[name].declarations():
                value = getattr(getattr(self, name), field.name)
                if value is None:
                    continue
                source = self.sources.get(field.name)
                items.append(f"{field.name} {value}" + (f" [{source}]" if source else ""))
            if items:  # a section with nothing set (no parent run, say) says nothing
                lines += _wrap(items, width, f"  {name}: ", "    ")
        return "\n".join(lines)

    # -- the command line -----------------------------------------------------------------------
    @classmethod
    def add_flags(cls, parser, prepare=False, skip=(), default_texts=None):
        """Adds a flag per setting (those `prepare` reads, with prepare=True; none for the
        settings named in `skip`, which the command decides itself), each defaulting to None
        so that `given(args)` tells what the command line set. `default_texts` ({setting:
        text}): what --help says of a default the command sets otherwise."""
        default_texts = default_texts or {}
        for name, kind in cls.sections().items():
            fields = [(field, base) for field, base, _ in kind.declarations()
                      if field.metadata["flag"] and field.name not in skip
                      and (field.metadata["prepare"] or not prepare)]
            if not fields:  # no empty group in --help
                continue
            group = parser.add_argument_group(f"{name} settings")
            for field, base in fields:
                meta = field.metadata
                default = (default_texts.get(field.name) or meta["default_text"]
                           or f"default {field.default}")
                options = dict(default=None, help=f"{meta['help']} ({default})")
                if base is bool:
                    options["action"] = argparse.BooleanOptionalAction
                else:
                    options.update(type=base, metavar=field.name.upper())
                    if meta["choices"]:
                        options.update(choices=meta["choices"], metavar=None)
                    if meta["many"]:  # one per language pair; one value reads as before
                        options["nargs"] = "+"
                group.add_argument("--" + field.name.replace("_", "-"), **options)

    @classmethod
    def given(cls, args):
        """{setting: value} of the flags given on the command line (a flag that takes one
        value per pair, given one, gives that value)."""
        given = {key: getattr(args, key) for key in cls.keys()
                 if getattr(args, key, None) is not None}
        return {key: value[0] if isinstance(value, list) and len(value) == 1
                and cls.keys()[key][1].metadata["many"] else value
                for key, value in given.items()}


def _section_keys(cls, section):
    return [field.name for field, *_ in cls.sections()[section].declarations()]


def _wrap(items, width, first, indent):
    """Lines of comma-separated items, never breaking an item (a value and its source)."""
    lines, line = [], first
    for i, item in enumerate(items):
        text = item + ("," if i < len(items) - 1 else "")
        if len(line) + len(text) + 1 > width and line.strip() and line != first:
            lines.append(line.rstrip())
            line = indent
        line += ("" if line in (first, indent) else " ") + text
    lines.append(line.rstrip())
    return lines
