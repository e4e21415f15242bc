"""Decoding: the request, the searches, the engines, the decoder and the file-level jobs.

Its rooms are floors, each importing only from those above it in this list:

    request.py        Request: the decoding options' values, each option declared once (flags,
                      checks, signature inputs and defaults come from it); no run, no engine
    search/           the graph search bodies, one per mode, that every caller runs
                      (Translator, SavedModel, TFLite):
        greedy.py         greedy search; translate_greedy
        beam_search.py    beam search with the GNMT length penalty (Section 6.1): one step
                          for every mode, the modes composed from the options (beam_modes)
        modes.py          beam search's modes: the hooks the step calls (BeamMode), the
                          choice of beams by score (Selection); the loop over every sentence
                          (LoopShape), the loop shape of greedy search too
        prefix.py         the prefix mode of beam search: forced tokens (PrefixForcing)
        constraints.py    lexical constraints for beam search: phrase tracking, dynamic beam
                          allocation (Post and Vilar 2018); their mode (ConstraintBanks)
        repetition.py     the repetition controls of greedy and beam search: no repeated
                          n-grams, the repetition penalty; their mode (RepetitionControl)
        sampling.py       top-k / top-p / temperature sampling
        scoring.py        log P(target | source) of given pairs
        step.py           model_step: the bridge from a Transformer (or an ensemble) to the
                          searches, the step function, its state and the output limits
        rules.py          what every body shares: banned tokens, prefixes, the empty-row
                          rule, trimming
        alignment.py      word alignments from the cross-attention (Pharaoh format), and AER
        compiling.py      compile_search: a search compiled once per backend; the shape
                          buckets of static searches
        compact.py        compact loops: done sentences leave the loop (TensorFlow graphs
                          without XLA), their results written out as they leave; the
                          compact loop shape of both searches (CompactLoop)
        top_k.py          a beam step's best continuations by an exact top-k in two
                          stages; gather_beams
    engines/          the engines, one text layer over them:
        engine.py         the engine interface: the text layer shared by every engine
        translator.py     Translator, the Keras engine (TensorFlow or JAX, float32 or bf16)
        ctranslate2.py    CTranslate2Translator, the engine of a CTranslate2 export
        precision.py      float32 or bfloat16 (where the CPU has bf16 units): the choice, the cast
        xla.py            XLA or not: the choice of `xla: auto` where measured, with its reason
        languages.py      the target languages of a run of several pairs: tags, refusals
    decoder.py        Decoder: the one way in; where each value came from, the run's saved
                      choice (decoding.json's one writer), the precision, the line on standard
                      error, and the engine built from a request
    jobs/             the file-level jobs of the commands:
        streaming.py      windows of line-aligned files, resumable output
        resumable.py      the resumable output file (O.partial and its record)
        textio.py         text lines in and out (the UTF-8 line policy)

Names are imported when first used, so that `import keras_transformer.decoding.request` (the
command line's parser) loads no search and no engine.
"""

import importlib

_LAZY = {"Translator": "keras_transformer.decoding.engines.translator",
         "CTranslate2Translator": "keras_transformer.decoding.engines.ctranslate2",
         "Decoder": "keras_transformer.decoding.decoder",
         "Request": "keras_transformer.decoding.request"}


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
