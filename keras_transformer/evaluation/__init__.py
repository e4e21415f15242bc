"""Evaluation: BLEU and chrF of translations (`bleu.py`), attention pictures
(`attention_maps.py`)."""

from keras_transformer.evaluation.bleu import score, split_compounds, tokenized_bleu  # noqa: F401
