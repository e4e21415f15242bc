"""Evaluating a split: translate it, write the hypotheses, score them. One function, used by
`keras-transformer evaluate` and by the main job."""

from keras_transformer.evaluation.bleu import score
from pipelines.files import write_lines


def evaluate_split(translator, sources, references, *, lang, official_references=None,
                   output=None, progress=True, desc=None):
    """Translates `sources`, writes the hypotheses and scores them against `references`.

    Args:
        translator: anything with `translate(texts, progress=bar)` (a `Translator`, a
            `CTranslate2Translator`).
        sources, references: lists of strings of the same length.
        lang: the target language (for the Multi30k literature convention's BLEU).
        official_references: the official tokenized references, when the split has them.
        output: the hypotheses file, written atomically (None: not written).
        progress: show a progress bar over the sentences on standard error.
        desc: the bar's label.

    Returns:
        `bleu.score`'s dict: sacreBLEU, chrF, tokenized and literature BLEU, signatures, and
        "lines", the scores as printable lines.
    """
    from pipelines.progress import progress_bar

    with progress_bar(total=len(sources), unit=" sentences", desc=desc,
                      disable=not progress) as bar:
        hypotheses = translator.translate(sources, progress=bar)
    if output is not None:
        write_lines(output, hypotheses)
    return score(hypotheses, references, lang=lang, tokenized_references=official_references)
