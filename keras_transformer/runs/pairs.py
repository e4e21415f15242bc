"""The language pairs of a run's data settings: one pair (as every run before several targets
existed), or several, pair i being tgt_lang[i] with its own files.

    data.tgt_lang = ["de", "fr"]; data.src_lang = "en"          # one source for all
    [p.name for p in language_pairs(data)]                      # ["en-de", "en-fr"]

`check_pairs` is the data section's check of the lists (called when a config is made, so a bad
config is refused before anything is written): as many sources, files and dev files as
targets, no pair twice, no pair into its own language, languages the dataset has.
"""

import dataclasses
import typing

from keras_transformer.errors import ConfigError

# The languages of the Multi30k task 1 files (../shared/data/multi30k).
MULTI30K_LANGUAGES = ("en", "de", "fr", "cs")
# Per-pair file settings of dataset "text".
FILE_KEYS = ("train_src", "train_tgt", "dev_src", "dev_tgt")


@dataclasses.dataclass(frozen=True)
class Pair:
    """One language pair of a run and its text files (dataset "text"; else None)."""

    src_lang: str
    tgt_lang: str
    train: typing.Tuple[typing.Optional[str], typing.Optional[str]] = (None, None)
    dev: typing.Tuple[typing.Optional[str], typing.Optional[str]] = (None, None)

    @property
    def name(self):
        """"en-fr": how logs, TensorBoard tags and tables name the pair."""
        return f"{self.src_lang}-{self.tgt_lang}"

    def text_files(self):
        """{split: (source file, target file)} as `pipelines.datasets` takes them."""
        return {"train": self.train, "dev": self.dev}


def as_list(value):
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _per_pair(data, key, count):
    """The values of setting `key`, one per pair (a single value stands for every pair)."""
    values = as_list(getattr(data, key))
    return values * count if len(values) == 1 else values


def check_pairs(data):
    """Refuses, naming the keys and values, lists that do not make pairs (ConfigError)."""
    targets = as_list(data.tgt_lang)
    count = len(targets)
    sources = as_list(data.src_lang)
    if len(sources) not in (1, count):
        raise ConfigError(f"Config key 'src_lang' gives {len(sources)} languages {sources!r} "
                          f"for {count} pairs (tgt_lang {targets!r}): give one source language "
                          "for all pairs, or one per pair.")
    if count > 1:
        if data.dataset == "ptb":
            raise ConfigError(f"dataset 'ptb' (parsing) has one task: tgt_lang must be one "
                              f"value; got {targets!r}.")
        for key in FILE_KEYS:
            value = getattr(data, key)
            given = as_list(value) if value is not None else []
            if data.dataset == "text" and given and len(given) != count:
                raise ConfigError(
                    f"Config key {key!r} lists {len(given)} file(s) {given!r} for {count} pairs "
                    f"(tgt_lang {targets!r}): pair i is train_src[i], train_tgt[i], "
                    "tgt_lang[i]; give one file per pair.")
    if count > 1 and (data.dev_src is None) != (data.dev_tgt is None):
        missing = "dev_tgt" if data.dev_tgt is None else "dev_src"
        raise ConfigError(f"Config key {missing!r} is missing: a dev set needs both dev_src "
                          "and dev_tgt.")
    seen = {}
    for source, target in zip(_per_pair(data, "src_lang", count), targets):
        if source == target:
            raise ConfigError(f"Config key 'tgt_lang' must differ from src_lang; got "
                              f"{target!r}.")
        if (source, target) in seen:
            raise ConfigError(f"the pair {source}-{target} is given twice (tgt_lang "
                              f"{targets!r}): give each pair once.")
        seen[source, target] = True
        if data.dataset == "multi30k" and count > 1:
            for lang in (source, target):
                if lang not in MULTI30K_LANGUAGES:
                    raise ConfigError(f"Multi30k has no language {lang!r} (tgt_lang "
                                      f"{targets!r}); choose from "
                                      f"{', '.join(MULTI30K_LANGUAGES)}.")


def language_pairs(data):
    """[Pair] of a data section, in the order of tgt_lang."""
    targets = as_list(data.tgt_lang)
    count = len(targets)
    sources = _per_pair(data, "src_lang", count)

    def files(key):
        value = getattr(data, key)
        return [None] * count if value is None else _per_pair(data, key, count)

    return [Pair(source, target, (train_src, train_tgt), (dev_src, dev_tgt))
            for source, target, train_src, train_tgt, dev_src, dev_tgt in zip(
                sources, targets, *(files(key) for key in FILE_KEYS))]
