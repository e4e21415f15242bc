"""Decoding: greedy and beam search over a step function, and `Translator` for text.

    search.py        greedy search; `model_step` bridges a Transformer to the searches;
                     translate_greedy, the greedy body (each mode has one body: every
                     caller, Translator, SavedModel and TFLite, runs it)
    beam_search.py   beam search with the GNMT length penalty (Section 6.1); translate_beam
    sampling.py      top-k / top-p / temperature sampling; translate_sample
    scoring.py       log P(target | source) of given pairs; score_ids
    translate.py     Translator: batching, tokenization, truncation, n-best
    precision.py     float32 or bfloat16 (where the CPU has bf16 units): the choice, the cast
    choice.py        what a command decodes a run with, said in one line
    alignment.py     word alignments from the cross-attention (Pharaoh format), and AER
"""

from keras_transformer.decoding.translate import Translator  # noqa: F401
