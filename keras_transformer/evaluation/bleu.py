"""Scoring translations: sacreBLEU (with its signature), chrF, and the paper-style tokenized BLEU.

The paper's BLEU is computed on tokenized text with compound splitting (tensor2tensor's
`get_ende_bleu.sh`: hyphenated compounds "a-b" become "a ##AT##-##AT## b" before multi-bleu).
We reproduce it with sacreBLEU's 13a tokenizer, the same compound splitting, and BLEU on the
resulting tokens. It is usually 0.5-1.5 higher than sacreBLEU and not comparable with it.

The Multi30k literature scores differently again (`literature_bleu`): hypotheses lowercased,
punctuation-normalized and Moses-tokenized (sacremoses, XML-escaped as the official files), then
BLEU on those tokens against the official `*.lc.norm.tok.*` references. Normalizing raw
references the same way reproduces the official files, so any test set can be scored so.
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


def literature_tokenize(texts, lang):
    """The Multi30k convention's text: lowercased, then Moses punctuation normalization and
    tokenization for `lang` with XML escaping (`&quot;`, `&apos;`), as the official
    `*.lc.norm.tok.*` files."""
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    normalizer, tokenizer = MosesPunctNormalizer(lang), MosesTokenizer(lang)
    return [tokenizer.tokenize(normalizer.normalize(text.lower()), escape=True, return_str=True)
            for text in texts]


def literature_bleu(hypotheses, references, lang, tokenized_references=None):
    """BLEU in the Multi30k literature convention (lowercased, normalized, Moses-tokenized;
    BLEU on those tokens). `tokenized_references`: the official tokenized references if known,
    else the raw `references` are normalized the same way (which reproduces the official files).

    Returns (score, which references: "official" or "normalized")."""
    if tokenized_references is None:
        refs, kind = literature_tokenize(references, lang), "normalized"
    else:
        if len(tokenized_references) != len(hypotheses):
            raise InputError(f"{len(hypotheses)} hypotheses for {len(tokenized_references)} "
                             "official tokenized references.")
        refs, kind = [line.strip() for line in tokenized_references], "official"
    hyps = literature_tokenize(hypotheses, lang)
    return round(sacrebleu.corpus_bleu(hyps, [refs], tokenize="none", force=True).score, 2), kind


def score(hypotheses, references, lang=None, tokenized_references=None):
    """Returns a dict of scores and printable lines. With `lang` (the target language) it also
    gives the Multi30k literature convention's BLEU (see `literature_bleu`)."""
    if len(hypotheses) != len(references):
        raise InputError(f"{len(hypotheses)} hypotheses for {len(references)} references.")
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    paper = tokenized_bleu(hypotheses, references)
    literature = {}
    if lang is not None:
        value, kind = literature_bleu(hypotheses, references, lang, tokenized_references)
        literature = {"literature_bleu": value, "literature_references": kind}
    result = {
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
        **literature,
    }
    if literature:
        result["lines"].append(
            f"BLEU, Multi30k literature convention (lowercased, Moses-normalized and tokenized, "
            f"against the {kind} tokenized references; not sacreBLEU): {value:.2f}")
    return result
