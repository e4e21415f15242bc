"""Evaluation: BLEU and chrF of translations (`bleu.py`), a split translated, written and
scored (`evaluate.py`: what `keras-transformer evaluate` and the main job call), attention
pictures (`attention_maps.py`)."""

from keras_transformer.evaluation.bleu import score, split_compounds, tokenized_bleu  # noqa: F401
from keras_transformer.evaluation.evaluate import evaluate_split  # noqa: F401
