"""Terminology for the translate job: constraints given on the input lines and glossaries.

    source, phrases = split_line("A red car.\\tein rotes Auto")   # fairseq's --constraints
    glossary = Glossary.read("terms.tsv", ignore_case=True)       # source term<TAB>target term
    glossary.targets("The Eiffel Tower at night.")               # ["Eiffelturm"]

Each phrase is target-language text that must appear in the translation
(`Engine.translate(..., constraints=...)`, the constrained beam search of
`decoding.search.beam_search`). A glossary's source term matches whole words of the source
(not inside a longer word), case-sensitively unless asked; the target terms of the terms found
become that sentence's constraints, after the line's own, each phrase once.
"""

import re

from keras_transformer.decoding.jobs.textio import decode_line, raw_lines
from keras_transformer.errors import InputError
from pipelines.vocabulary import normalize_whitespace


def split_line(line, where=None):
    """(source, [phrase, ...]) of a `source<TAB>phrase<TAB>...` line. An empty phrase (two tabs
    in a row, a tab at the end) is refused naming `where` (e.g. "input.txt line 3")."""
    source, *phrases = line.rstrip("\n").split("\t")
    phrases = [normalize_whitespace(phrase) for phrase in phrases]
    if any(not phrase for phrase in phrases):
        raise InputError(f"{where or 'a line'}: an empty constraint phrase (two tabs in a row, "
                         "or a tab at the end of the line): remove the extra tab.")
    return source, phrases


def merged(*lists):
    """The phrases of several lists, each once, in order."""
    return list(dict.fromkeys(phrase for phrases in lists for phrase in phrases))


class Glossary:
    """Source terms and their target terms (see the module doc).

    Args:
        terms: [(source term, target term)].
        ignore_case: match the source terms ignoring case.
    """

    def __init__(self, terms, ignore_case=False):
        self.terms = list(terms)
        flags = re.IGNORECASE if ignore_case else 0
        # Whole words: no word character right before or after the term.
        self._patterns = [(re.compile(rf"(?<!\w){re.escape(source)}(?!\w)", flags), target)
                          for source, target in self.terms]

    @classmethod
    def read(cls, path, ignore_case=False):
        """The glossary of a TSV file (one `source term<TAB>target term` per line; empty lines
        skipped). InputError names the file and line of a line that is not two non-empty
        tab-separated fields, or not UTF-8."""
        terms = []
        for number, offset, raw in raw_lines(path):
            line, problem = decode_line(raw, number, offset, path)
            if problem:
                raise InputError(f"{problem}: a glossary must be UTF-8 text.")
            if not line.strip():
                continue
            fields = [normalize_whitespace(field) for field in line.rstrip("\n").split("\t")]
            if len(fields) != 2 or not all(fields):
                raise InputError(f"{path} line {number}: a glossary line is 'source "
                                 "term<TAB>target term' (two non-empty fields); got "
                                 f"{line.rstrip()!r}.")
            terms.append(tuple(fields))
        if not terms:
            raise InputError(f"{path} holds no terms: a glossary line is 'source "
                             "term<TAB>target term'.")
        return cls(terms, ignore_case)

    def targets(self, source):
        """The target terms of the source terms found in `source`, each once."""
        return merged([target for pattern, target in self._patterns if pattern.search(source)])
