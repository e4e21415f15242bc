"""Evaluating a split: translate it, write the hypotheses, score them. One function, used by
`keras-transformer evaluate` and by the main job."""

import contextlib
import pathlib

from keras_transformer.errors import InputError
from keras_transformer.evaluation.bleu import score
from keras_transformer.decoding.jobs.streaming import window_size
from keras_transformer.decoding.jobs.textio import windows
from pipelines.files import atomic_path


def alignments_path(output):
    """Where `evaluate --alignments` writes the hypotheses' word alignments: beside the
    hypotheses file, hyp.test.beam4.txt -> hyp.test.beam4.align.txt."""
    output = pathlib.Path(output)
    return output.with_name(output.stem + ".align" + output.suffix)


def evaluate_split(translator, sources, references, *, lang, official_references=None,
                   output=None, progress=True, desc=None, alignments=None):
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
        alignments: a file for the word alignment of each hypothesis (Pharaoh format, one
            line per sentence, written atomically as `output`), or None; the translator must
            support `translate(..., alignments=True)`.

    Returns:
        `bleu.score`'s dict: sacreBLEU, chrF, tokenized and literature BLEU, signatures, and
        "lines", the scores as printable lines.

    Raises:
        InputError: no references (an empty test set), before anything is written.
    """
    from pipelines.progress import progress_bar

    if not references:  # before anything is translated or written
        raise InputError("Nothing to evaluate: the test set has no sentences, and BLEU of no "
                         "sentences is undefined. Give a test set of at least one sentence "
                         "pair.")
    if hasattr(sources, "__len__") and len(sources) != len(references):
        raise ValueError(f"{len(sources)} sources for {len(references)} references.")
    hypotheses = []
    window = window_size(getattr(translator, "batch_size", 64), translator)
    with contextlib.ExitStack() as stack:
        bar = stack.enter_context(progress_bar(total=len(references), unit=" sentences",
                                               desc=desc, disable=not progress))
        handles = {}
        for key, path in (("hypotheses", output), ("alignments", alignments)):
            if path is not None:
                temporary = stack.enter_context(atomic_path(path))
                handles[key] = stack.enter_context(open(temporary, "w", encoding="utf-8"))
        for chunk in windows(sources, window):
            if alignments is None:
                found = translator.translate(chunk, progress=bar)
            else:
                found, links = zip(*translator.translate(chunk, progress=bar, alignments=True))
                handles["alignments"].writelines(line + "\n" for line in links)
            hypotheses.extend(found)
            if "hypotheses" in handles:
                handles["hypotheses"].writelines(line + "\n" for line in found)
        for handle in handles.values():
            handle.close()  # before atomic_path renames it
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} sources for {len(references)} references.")
    return score(hypotheses, references, lang=lang, tokenized_references=official_references)
