"""TFLite export: `source_ids` (1, S) int32 -> `ids` (1, T) int32 and `score` (1,) float32
with a fixed search (beam 4 and alpha 0.6 by default, or greedy), and the whole beam:
`nbest_ids` (1, K, T) and `nbest_scores` (1, K), best first (K = 1 for greedy search). Builtin
TFLite ops only, the weights as constants; float32, dynamic-range int8 or float16 weights. The
sentencepiece model is written beside it for tokenizing on the device. The search is
`decoding`'s (`translate_greedy`, `translate_beam`), the one `Translator` runs."""

import logging
import pathlib
import tempfile
import time
import types

import tensorflow as tf

from keras_transformer.decoding.search.beam_search import translate_beam
from keras_transformer.decoding.search.rules import trim
from keras_transformer.decoding.search.greedy import translate_greedy
from keras_transformer.decoding.search.modes import LoopShape
from keras_transformer.decoding.request import DEFAULTS
from keras_transformer.defaults import MAX_LENGTH
from keras_transformer.export.graph import ExportError, graph_function, prepare_ids
from keras_transformer.export.saved_model import as_when_saving
from keras_transformer.runs.run import remove_stale_temporaries, write_bytes
from pipelines.files import no_space, no_space_error

log = logging.getLogger(__name__)

QUANTIZATIONS = ("none", "dynamic", "float16")


class TFLiteTranslator(tf.Module):
    """One sentence of ids -> ids with a fixed search, for conversion to TFLite.

    Args:
        model: a trained `Transformer`.
        beam_size: 1 runs greedy search; otherwise beam search (paper: 4).
        alpha: length penalty (beam search only).
        max_input_length: longer inputs are truncated.
    """

    def __init__(self, model, beam_size=DEFAULTS["beam_size"], alpha=DEFAULTS["alpha"],
                 max_input_length=MAX_LENGTH):
        super().__init__(name="tflite_translator")
        self._parts = types.SimpleNamespace(model=model)
        self.beam_size, self.alpha = int(beam_size), float(alpha)
        self.max_input_length = max_input_length

    @graph_function(input_signature=[tf.TensorSpec([1, None], tf.int32, name="source_ids")])
    def translate(self, source_ids):
        model = self._parts.model
        ids, empty = prepare_ids(source_ids, self.max_input_length)
        # One sentence: no other to drop from the loop, so every sentence to its end
        # (LoopShape; TFLite's builtin ops lack the compact loop's index lists).
        if self.beam_size == 1:
            result = translate_greedy(model, ids, empty_rows=empty, shape=LoopShape)
        else:
            result = translate_beam(model, ids, self.beam_size, self.alpha, empty_rows=empty,
                                    shape=LoopShape)
        nbest, nbest_scores = result["ids"], result["scores"]
        return {"ids": trim(nbest[:, 0, :]), "score": nbest_scores[:, 0], "nbest_ids": nbest,
                "nbest_scores": nbest_scores}

    def track_variables(self, options=None):
        with as_when_saving(options):  # traced once, as the save traces it
            self.model_variables = list(self.translate.get_concrete_function().variables)


def convert_tflite(model, quantize="none", beam_size=DEFAULTS["beam_size"], alpha=DEFAULTS["alpha"],
                   max_input_length=MAX_LENGTH):
    """The TFLite flatbuffer (bytes) of `TFLiteTranslator`; builtin ops only.

    quantize: "none" (float32), "dynamic" (int8 weights, float activations) or "float16"
    (float16 weights).
    """
    if quantize not in QUANTIZATIONS:
        raise ExportError(f"quantize={quantize!r} must be one of {', '.join(QUANTIZATIONS)}.")
    module = TFLiteTranslator(model, beam_size, alpha, max_input_length)
    options = tf.saved_model.SaveOptions()
    module.track_variables(options)
    with tempfile.TemporaryDirectory() as tmp:
        # Converting from a SavedModel freezes the variables read inside the search loop.
        try:
            tf.saved_model.save(module, tmp, signatures={"serving_default": module.translate},
                                options=options)
        except Exception as error:
            if no_space(error):  # the temporary folder (TMPDIR) is full
                raise no_space_error(pathlib.Path(tmp) / "variables", error,
                                     temporary=True) from None
            raise
        converter = tf.lite.TFLiteConverter.from_saved_model(tmp)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        if quantize == "dynamic":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        elif quantize == "float16":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
            converter.target_spec.supported_types = [tf.float16]
        return converter.convert()


def tflite_filename(beam_size, quantize):
    search = "greedy" if beam_size == 1 else f"beam{beam_size}"
    return f"translator-{search}-{'float32' if quantize == 'none' else quantize}.tflite"


def export_tflite(model, tokenizer, output_dir, quantize="none", beam_size=DEFAULTS["beam_size"],
                  alpha=DEFAULTS["alpha"], max_input_length=MAX_LENGTH, overwrite=False):
    """Writes output_dir/translator-<search>-<quantization>.tflite and spm.model beside it."""
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(output_dir)
    target = output_dir / tflite_filename(beam_size, quantize)
    if target.exists() and not overwrite:
        raise ExportError(f"{target} already exists; allow overwriting to replace it.")
    start = time.time()
    data = convert_tflite(model, quantize, beam_size, alpha, max_input_length)
    write_bytes(output_dir / tokenizer.FILENAME, tokenizer.model_proto)
    write_bytes(target, data)
    log.info("TFLite model written to %s (%.1f MB) in %.1f s", target, len(data) / 1e6,
             time.time() - start)
    return target
