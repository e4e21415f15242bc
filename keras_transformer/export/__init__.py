"""Export for serving: a SavedModel for TensorFlow Serving and a TFLite translator.

    graph.py         the exported graphs around decoding's search bodies (request checks)
    saved_model.py   SavedModel: the text signatures and translate_ids (ids) signatures
    text_signatures.py  serving_default, translate_nbest, sample, score (text in, text out)
    tflite.py        TFLite: one sentence of ids -> ids, builtin ops, optional quantization
    ct2.py           CTranslate2: the weights as its TransformerSpec, float32/int8/float16

`export_run` exports a training run (with the model and search chosen for it, see
`decoding.choice`); `export_base` and `ctranslate2_folder` say where a run's exports go.
"""

import os
import pathlib
import re

from keras_transformer.decoding.choice import decoding_choice
from keras_transformer.defaults import EXPORT_DIR
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


def export_name(run_dir, name=None):
    """The name an export of `run_dir` goes under: `name`, else the run directory's name."""
    name = name or os.path.basename(os.path.abspath(run_dir))
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ExportError(f"name={name!r}: use letters, digits, '.', '_' and '-' only.")
    return name


def export_base(run_dir, output_dir=EXPORT_DIR, name=None):
    """OUTPUT_DIR/NAME: the folder of a run's exports (SavedModel versions, tflite/,
    ctranslate2*/)."""
    return pathlib.Path(output_dir) / export_name(run_dir, name)


def ctranslate2_folder(run_dir, quantize="none", output_dir=EXPORT_DIR, name=None):
    """OUTPUT_DIR/NAME/ctranslate2[-QUANTIZE]: where a run's CTranslate2 export goes (and where
    `translate --engine ctranslate2` looks for it)."""
    return export_base(run_dir, output_dir, name) / ct2.ctranslate2_dirname(quantize)


def export_run(run_dir, format="savedmodel", quantize="none", output_dir=EXPORT_DIR,
               name=None, version=None, overwrite=False, beam_size=None, alpha=None,
               model_file=None, ids_only=False):
    """Exports a training run; returns the path written.

    SavedModel: OUTPUT_DIR/NAME/VERSION/. TFLite: OUTPUT_DIR/NAME/tflite/*.tflite.
    CTranslate2: OUTPUT_DIR/NAME/ctranslate2[-QUANTIZE]/.
    NAME defaults to the run directory's name. `model_file`, `beam_size` and `alpha` default
    to the choice saved in the run, else to the run's newest model and
    `defaults.TRANSLATION` (`decoding.choice.decoding_choice`). beam_size and alpha fix the
    TFLite search; in a SavedModel they are the default inputs of its signatures, and
    beam_size the beam of its translate_ids_xla signature.
    """
    if format not in FORMATS:
        raise ExportError(f"format={format!r} must be one of {', '.join(FORMATS)}.")
    if quantize not in QUANTIZE_CHOICES[format]:
        raise ExportError(f"quantize={quantize!r} does not apply to the {format} format "
                          f"(choices: {', '.join(QUANTIZE_CHOICES[format])}).")
    if format == "ctranslate2":
        ct2.require_ctranslate2()  # before anything is loaded
    if beam_size is not None and beam_size < 1:
        raise ExportError(f"beam_size={beam_size} must be at least 1.")
    base_dir = export_base(run_dir, output_dir, name)
    # An ensemble exports as one SavedModel; the other formats take one model.
    run = (open_run(run_dir) if format == "savedmodel"
           else open_single_run(run_dir, f"a {format} export"))
    choice = decoding_choice(run, model=model_file, beam_size=beam_size, alpha=alpha)
    model = run.load_model(path=choice.model_file)
    tokenizer, max_input_length = run.tokenizer(), run.config.max_length
    if format == "ctranslate2":
        folder = ctranslate2_folder(run_dir, quantize, output_dir, name)
        return ct2.export_ctranslate2(model, tokenizer, folder, quantize, max_input_length,
                                      overwrite)
    if format == "savedmodel":
        return export_saved_model(model, tokenizer, base_dir, version, overwrite,
                                  max_input_length, ids_only, choice.beam_size, choice.alpha)
    return export_tflite(model, tokenizer, base_dir / "tflite", quantize, choice.beam_size,
                         choice.alpha, max_input_length, overwrite)
