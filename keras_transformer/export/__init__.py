"""Export for serving: a SavedModel for TensorFlow Serving and a TFLite translator.

    graph.py         the search as exported graphs run it (the Translator's rules, core ops)
    saved_model.py   SavedModel: serving_default (text) and translate_ids (ids) signatures
    tflite.py        TFLite: one sentence of ids -> ids, builtin ops, optional quantization
    ct2.py           CTranslate2: the weights as its TransformerSpec, float32/int8/float16

`export_run` exports a training run (its averaged model if there is one, else its final one).
"""

import os
import pathlib
import re

from keras_transformer.defaults import TRANSLATION
from keras_transformer.export.graph import ExportError  # noqa: F401
from keras_transformer.export.saved_model import (  # noqa: F401
    IdsTranslatorModule, TranslatorModule, existing_versions, export_saved_model,
    signature_op_types)
from keras_transformer.export.tflite import (  # noqa: F401
    QUANTIZATIONS, TFLiteTranslator, convert_tflite, export_tflite, tflite_filename)
from keras_transformer.export import ct2
from keras_transformer.runs import open_run, open_single_run

FORMATS = ("savedmodel", "tflite", "ctranslate2")
QUANTIZE_CHOICES = {"savedmodel": ("none",), "tflite": QUANTIZATIONS,
                    "ctranslate2": ct2.QUANTIZATIONS}


def export_run(run_dir, format="savedmodel", quantize="none", output_dir="saved_models",
               name=None, version=None, overwrite=False, beam_size=TRANSLATION.beam_size,
               alpha=TRANSLATION.alpha, model_file=None, ids_only=False):
    """Exports a training run; returns the path written.

    SavedModel: OUTPUT_DIR/NAME/VERSION/. TFLite: OUTPUT_DIR/NAME/tflite/*.tflite.
    CTranslate2: OUTPUT_DIR/NAME/ctranslate2[-QUANTIZE]/.
    NAME defaults to the run directory's name. beam_size and alpha fix the TFLite search;
    beam_size also the SavedModel's translate_ids_xla signature.
    """
    if format not in FORMATS:
        raise ExportError(f"format={format!r} must be one of {', '.join(FORMATS)}.")
    if quantize not in QUANTIZE_CHOICES[format]:
        raise ExportError(f"quantize={quantize!r} does not apply to the {format} format "
                          f"(choices: {', '.join(QUANTIZE_CHOICES[format])}).")
    if format == "ctranslate2":
        ct2.require_ctranslate2()  # before anything is loaded
    if beam_size < 1:
        raise ExportError(f"beam_size={beam_size} must be at least 1.")
    name = name or os.path.basename(os.path.abspath(run_dir))
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ExportError(f"name={name!r}: use letters, digits, '.', '_' and '-' only.")
    # An ensemble exports as one SavedModel; the other formats take one model.
    run = (open_run(run_dir) if format == "savedmodel"
           else open_single_run(run_dir, f"a {format} export"))
    model = run.load_model(path=model_file)
    tokenizer, max_input_length = run.tokenizer(), run.config.max_length
    base_dir = pathlib.Path(output_dir) / name
    if format == "ctranslate2":
        folder = base_dir / ct2.ctranslate2_dirname(quantize)
        return ct2.export_ctranslate2(model, tokenizer, folder, quantize, max_input_length,
                                      overwrite)
    if format == "savedmodel":
        return export_saved_model(model, tokenizer, base_dir, version, overwrite,
                                  max_input_length, ids_only, beam_size)
    return export_tflite(model, tokenizer, base_dir / "tflite", quantize, beam_size, alpha,
                         max_input_length, overwrite)
