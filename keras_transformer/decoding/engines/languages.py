"""Which language an engine translates into: a run of several pairs writes the language whose
tag is in front of the source (`pipelines.multilingual`); a one-pair run has one target and no
tag, and decodes exactly as before several targets existed.

    languages = TargetLanguages.of_config(run.config, chosen="fr")
    languages.tags(3, None)          # ["<2fr>"] * 3: the chosen default
    languages.tags(2, ["de", "fr"])  # one per sentence
    TargetLanguages.of_config(one_pair_config).tags(3, None)   # None: no tag
"""

import dataclasses
import typing

from keras_transformer.errors import InputError
from pipelines.multilingual import tag, untag_alignment


@dataclasses.dataclass(frozen=True)
class TargetLanguages:
    """The targets of a run and the default one.

    Args:
        targets: a run of several pairs: its target languages, in order; () for one pair.
        default: the language when a call names none (None: a call must name one).
        single: a one-pair run's target: the one language it accepts by name.
    """

    targets: typing.Tuple[str, ...] = ()
    default: typing.Optional[str] = None
    single: typing.Optional[str] = None

    @classmethod
    def of_config(cls, config, chosen=None):
        """The languages of a run's config; `chosen` (a flag, an argument) is checked against
        them and becomes the default."""
        targets = config.target_languages
        if targets is None:
            languages = cls(single=config.tgt_lang)
        else:
            languages = cls(tuple(targets))
        if chosen is not None:
            languages.check(chosen)
            languages = dataclasses.replace(languages, default=chosen)
        return languages

    @property
    def several(self):
        return bool(self.targets)

    def check(self, language, what="--tgt-lang"):
        """Refuses a language the run does not translate into, naming its languages."""
        if self.several and language not in self.targets:
            raise InputError(f"{what} {language!r}: this model translates into "
                             f"{', '.join(self.targets)}; choose one of them.")
        if not self.several and self.single is not None and language != self.single:
            raise InputError(f"{what} {language!r}: this run translates into "
                             f"{self.single} only.")

    def tags(self, count, target_language=None):
        """The tag of each of `count` sentences (None: a one-pair run, no tag).
        `target_language`: one language, or one per sentence; default `default`."""
        language = target_language if target_language is not None else self.default
        if not self.several:
            if language is not None and self.single is None:  # a model in memory: as asked
                return _tags(count, language)
            if language is not None:
                self._check_each(language, "target_language")
            return None
        if language is None:
            raise InputError(f"this model translates into {', '.join(self.targets)}: say "
                             f"which with --tgt-lang (Python: target_language=...), e.g. "
                             f"--tgt-lang {self.targets[0]}.")
        self._check_each(language, "--tgt-lang" if isinstance(language, str) else
                         "target_language")
        return _tags(count, language)

    def _check_each(self, language, what):
        """`check` of one language, or of each of a list."""
        for item in [language] if isinstance(language, str) else language:
            self.check(item, what)

    @staticmethod
    def untag_alignment(line):
        return untag_alignment(line)


def _tags(count, language):
    if isinstance(language, str):
        return [tag(language)] * count
    language = list(language)
    if len(language) != count:
        raise InputError(f"target_language must give one language per sentence: {count} "
                         f"sentences, {len(language)} languages.")
    return [tag(item) for item in language]
