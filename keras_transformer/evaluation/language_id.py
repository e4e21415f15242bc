"""The share of outputs in the wrong language, by a language identifier that ships its model
(py3langid 0.4.0, a modernized langid.py: Lui and Baldwin, 2012), restricted to the languages
the run reads and writes, so that a short caption is told among those alone.

    wrong_language_share(hypotheses, "fr", candidates=("en", "de", "fr", "cs"))
"""


def identifier(candidates=()):
    """A py3langid identifier over `candidates` (all of its 97 languages when empty)."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    found = LanguageIdentifier.from_model_file(MODEL_FILE)
    if candidates:
        found.set_languages(sorted(set(candidates)))
    return found


def wrong_language_share(texts, language, candidates=()):
    """(share of the non-empty `texts` not identified as `language`, {language: count}).
    Empty outputs are not counted (no language to tell)."""
    found = identifier(candidates)
    counts = {}
    for text in texts:
        if text.strip():
            label = found.classify(text)[0]
            counts[label] = counts.get(label, 0) + 1
    total = sum(counts.values())
    wrong = total - counts.get(language, 0)
    return (wrong / total if total else 0.0), counts
