"""Stutter: an output that writes one subword piece several times in a row
("Leute gehen vor einem Gestestestestestestestil.", "Nummer 55555555"), the failure the
repetition controls (`decoding.search.repetition`) hold back. Counted on the output's
sentencepiece pieces: the detokenized text encoded again with the run's vocabulary.

    stutter_count(outputs, run.vocabulary())  # outputs with a piece 4+ times in a row
"""

STUTTER_RUN = 4  # a piece this many times in a row counts as a stutter


def stutters(pieces, run=STUTTER_RUN):
    """Whether the sequence `pieces` (pieces or ids) holds one item `run` or more times in a
    row."""
    if run < 2:
        raise ValueError(f"run={run!r} must be at least 2 (a piece repeated).")
    length, previous = 0, object()
    for piece in pieces:
        length = length + 1 if piece == previous else 1
        if length >= run:
            return True
        previous = piece
    return False


def stutter_count(texts, vocabulary, run=STUTTER_RUN):
    """How many of `texts` stutter (`stutters`) in the pieces `vocabulary` encodes them into:
    a `pipelines.vocabulary.Vocabulary` (`encode`) or a TensorFlow `SubwordTokenizer`
    (`tokenize`), as the engines take."""
    texts = list(texts)
    rows = (vocabulary.encode(texts) if hasattr(vocabulary, "encode")
            else vocabulary.tokenize(texts).to_list())
    return sum(stutters(ids, run) for ids in rows)
