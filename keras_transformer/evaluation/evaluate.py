"""Evaluating a split: translate it, write the hypotheses, score them. One function, used by
`keras-transformer evaluate` and by the main job."""

import contextlib

from keras_transformer.evaluation.bleu import score
from keras_transformer.decoding.streaming import window_size
from keras_transformer.decoding.textio import windows
from pipelines.files import atomic_path


def evaluate_split(translator, sources, references, *, lang, official_references=None,
                   output=None, progress=True, desc=None):
    """Translates `sources`, writes the hypotheses and scores them against `references`.

    The sources are translated a window at a time (`streaming.WINDOW_BATCHES` batches, sorted
    by length within it) and may come one at a time from a file; the hypotheses go to the
    output file as they come, under a temporary name renamed when all are written. Only the
    hypotheses and the references, which the scores need, are held whole.

    Args:
        translator: anything with `translate(texts, progress=bar)` (a `Translator`, a
            `CTranslate2Translator`).
        sources: strings, a list or any iterable, as many as the references.
        references: a list of strings.
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

    if hasattr(sources, "__len__") and len(sources) != len(references):
        raise ValueError(f"{len(sources)} sources for {len(references)} references.")
    hypotheses = []
    window = window_size(getattr(translator, "batch_size", 64))
    with contextlib.ExitStack() as stack:
        bar = stack.enter_context(progress_bar(total=len(references), unit=" sentences",
                                               desc=desc, disable=not progress))
        handle = None
        if output is not None:
            temporary = stack.enter_context(atomic_path(output))
            handle = stack.enter_context(open(temporary, "w", encoding="utf-8"))
        for chunk in windows(sources, window):
            found = translator.translate(chunk, progress=bar)
            hypotheses.extend(found)
            if handle is not None:
                handle.writelines(line + "\n" for line in found)
        if handle is not None:
            handle.close()  # before atomic_path renames it
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} sources for {len(references)} references.")
    return score(hypotheses, references, lang=lang, tokenized_references=official_references)
