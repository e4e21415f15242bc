"""Dev evaluation of a run of several language pairs: each pair's dev set tagged with its
target (`pipelines.multilingual`), evaluated apart, and the mean over the pairs.

The per-pair figures are keyed "en-fr/val_loss", "en-fr/bleu", ... beside the means under the
one-pair keys ("val_loss", "bleu", "chrf"), so that early stopping and best.keras follow the
mean over the pairs (each pair weighs the same, whatever its dev set's size), the progress lines
print every pair and TensorBoard writes `logs/dev` tags per pair ("en-fr/bleu").
"""

import numpy as np

from keras_transformer.training.callbacks import DevLoss, DevTranslation
from pipelines import datasets
from pipelines.multilingual import tagged


def pair_dev_texts(config):
    """{pair name: (tagged source texts, references)} of the pairs that have a dev split here
    (all of them or none: `runs.pairs.check_pairs` wants dev files for every pair)."""
    texts = {}
    for pair in config.data.pairs():
        where = config.data_arguments(pair.tgt_lang)
        if not datasets.has_split(config.dataset, "dev", **where):
            continue
        sources, references = datasets.split_texts(config.dataset, "dev", **where)
        texts[pair.name] = ([tagged(s, pair.tgt_lang) for s in sources], references)
    return texts


class PairDevLoss:
    """`DevLoss` of each pair's dev batches ({pair name: batches}), called with a model: the
    figures hold the means under the one-pair keys and each pair's figures under "PAIR/KEY"."""

    def __init__(self, datasets_by_pair, loss):
        self._passes = {name: DevLoss(batches, loss) for name, batches in datasets_by_pair.items()}

    def __call__(self, model):
        per_pair = {name: one(model) for name, one in self._passes.items()}
        results = {key: float(np.mean([r[key] for r in per_pair.values()]))
                   for key in next(iter(per_pair.values()))}
        for name, figures in per_pair.items():
            results.update({f"{name}/{key}": float(value) for key, value in figures.items()})
        return results


class PairDevTranslation(DevTranslation):
    """`DevTranslation` of each pair (`texts`: {pair name: (tagged sources, references)}): the
    figures hold the means and "PAIR/bleu", "PAIR/chrf"."""

    def score(self, translator):
        import sacrebleu

        per_pair = {}
        for name, (sources, references) in self.texts.items():
            hypotheses = translator.translate(sources)
            per_pair[name] = {"bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
                              "chrf": sacrebleu.corpus_chrf(hypotheses, [references]).score}
        bleu = float(np.mean([f["bleu"] for f in per_pair.values()]))
        chrf = float(np.mean([f["chrf"] for f in per_pair.values()]))
        figures = {"bleu": bleu, "chrf": chrf, **{
            f"{name}/{key}": value for name, pair in per_pair.items()
            for key, value in pair.items()}}
        return figures, (f"dev BLEU (greedy) mean {bleu:.2f}, chrF {chrf:.2f}; " + ", ".join(
            f"{name} {f['bleu']:.2f}/{f['chrf']:.2f}" for name, f in per_pair.items()))
