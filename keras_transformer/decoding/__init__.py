"""Decoding: the request, the engines, the searches and the file-level translate job.

    request.py       the decoding request: every option declared once (flags, checks,
                     signature defaults, the provenance line and decoding.json come from it)
    engine.py        the engine interface: the text layer shared by every engine
    translate.py     Translator, the Keras engine (TensorFlow or JAX, float32 or bf16)
    ctranslate2.py   CTranslate2Translator, the engine of a CTranslate2 export
    compiling.py     compile_search: a search compiled once per backend (tf.function, jax.jit)
    step.py          model_step: the bridge from a Transformer (or an ensemble) to the
                     searches, the step function, its state and the output limits
    rules.py         what every search body shares: banned tokens, prefixes, the empty-row
                     rule, trimming
    search.py        greedy search; translate_greedy, the greedy body (each mode has one
                     body: every caller, Translator, SavedModel and TFLite, runs it)
    beam_search.py   beam search with the GNMT length penalty (Section 6.1); translate_beam
    sampling.py      top-k / top-p / temperature sampling; translate_sample
    scoring.py       log P(target | source) of given pairs; score_ids
    precision.py     float32 or bfloat16 (where the CPU has bf16 units): the choice, the cast
    alignment.py     word alignments from the cross-attention (Pharaoh format), and AER
    streaming.py     the file-level jobs: windows of line-aligned files, resumable output
    resumable.py     the resumable output file (O.partial and its record)
    textio.py        text lines in and out (the UTF-8 line policy)

Names are imported when first used, so that `import keras_transformer.decoding.request` (the
command line's parser) loads no framework.
"""

import importlib

_LAZY = {"Translator": "keras_transformer.decoding.translate",
         "CTranslate2Translator": "keras_transformer.decoding.ctranslate2",
         "Request": "keras_transformer.decoding.request"}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
