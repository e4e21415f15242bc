"""Scoring translations: sacreBLEU (with its signature), chrF, and the paper-style tokenized BLEU.

The paper's BLEU is computed on tokenized text with compound splitting (tensor2tensor's
`get_ende_bleu.sh`: hyphenated compounds "a-b" become "a ##AT##-##AT## b" before multi-bleu).
We reproduce it with sacreBLEU's 13a tokenizer, the same compound splitting, and BLEU on the
resulting tokens. It is usually 0.5-1.5 higher than sacreBLEU and not comparable with it.
"""

import re

import sacrebleu
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

from keras_transformer.errors import InputError

_COMPOUND = re.compile(r"(?<=\S)-(?=\S)")


def split_compounds(text):
    """'Lkw-Fahrer-Zentrale' -> 'Lkw ##AT##-##AT## Fahrer ##AT##-##AT## Zentrale' (one pass:
    the lookarounds consume nothing, so chained compounds split too)."""
    return _COMPOUND.sub(" ##AT##-##AT## ", text)


def tokenized_bleu(hypotheses, references):
    tokenize = Tokenizer13a()
    hyps = [split_compounds(tokenize(h)) for h in hypotheses]
    refs = [split_compounds(tokenize(r)) for r in references]
    return sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", force=True)


def score(hypotheses, references):
    """Returns a dict of scores and printable lines."""
    if len(hypotheses) != len(references):
        raise InputError(f"{len(hypotheses)} hypotheses for {len(references)} references.")
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    paper = tokenized_bleu(hypotheses, references)
    return {
        "sacrebleu": round(bleu_score.score, 2),
        "sacrebleu_signature": str(bleu.get_signature()),
        "chrf": round(chrf_score.score, 2),
        "chrf_signature": str(chrf.get_signature()),
        "tokenized_bleu": round(paper.score, 2),
        "lines": [
            f"sacreBLEU {bleu_score.score:.2f}  ({bleu.get_signature()})  {bleu_score}",
            f"chrF {chrf_score.score:.2f}  ({chrf.get_signature()})",
            f"tokenized BLEU, paper style (13a tokens + compound splitting; not sacreBLEU): "
            f"{paper.score:.2f}",
        ],
    }
