"""Export for serving: a SavedModel for TensorFlow Serving, a TFLite translator and a
CTranslate2 folder (run by `decoding.engines.ctranslate2`).

    graph.py         the exported graphs around decoding's search bodies (request checks)
    batching.py      concurrent requests searched together in the graph (BatchFunction)
    saved_model.py   SavedModel: the text signatures and translate_ids (ids) signatures
    warmup.py        TensorFlow Serving's warm-up records, one request per signature
    text_signatures.py  serving_default, translate_nbest, sample, score (text in, text out)
    tflite.py        TFLite: one sentence of ids -> ids, builtin ops, optional quantization
    ct2.py           CTranslate2: the weights as its TransformerSpec, float32/int8/float16

`export_run` exports a training run (with the model and search chosen for it, see
`decoding.request`); `export_base` and `ctranslate2_folder` (`defaults`) say where a run's
exports go.
"""

from keras_transformer.decoding.decoder import Decoder
from keras_transformer.decoding.request import EXPORT, check
from keras_transformer.errors import InputError
from keras_transformer.defaults import (  # noqa: F401  (where a run's exports go)
    EXPORT_DIR, ctranslate2_folder, export_base, export_name)
from keras_transformer.export.batching import Batching
from keras_transformer.export.graph import ExportError  # noqa: F401
from keras_transformer.export.saved_model import (  # noqa: F401
    IdsTranslatorModule, TranslatorModule, existing_versions, export_saved_model,
    signature_op_types)
from keras_transformer.export.tflite import (  # noqa: F401
    QUANTIZATIONS, TFLiteTranslator, convert_tflite, export_tflite, tflite_filename)
from keras_transformer.export import ct2
from keras_transformer.runs import open_run
from keras_transformer.runs.ensemble import single_run

FORMATS = ("savedmodel", "tflite", "ctranslate2")
QUANTIZE_CHOICES = {"savedmodel": ("none",), "tflite": QUANTIZATIONS,
                    "ctranslate2": ct2.QUANTIZATIONS}


def export_run(run_dir, format="savedmodel", quantize="none", output_dir=EXPORT_DIR,
               name=None, version=None, overwrite=False, beam_size=None, alpha=None,
               model_file=None, ids_only=False, alignments=False, decoder=None,
               batching=Batching(), warmup=True):
    """Exports a training run; returns the path written.

    SavedModel: OUTPUT_DIR/NAME/VERSION/. TFLite: OUTPUT_DIR/NAME/tflite/*.tflite.
    CTranslate2: OUTPUT_DIR/NAME/ctranslate2[-QUANTIZE]/.
    NAME defaults to the run directory's name. `model_file`, `beam_size` and `alpha` default
    to the choice saved in the run, else to the run's newest model and the decoding
    request's defaults (`decoding.decoder.Decoder.resolve`). beam_size and alpha fix the
    TFLite search; in a SavedModel they are the default inputs of its signatures, and
    beam_size the beam of its translate_ids_xla signature. `alignments` (SavedModel only,
    not ids_only) adds the `alignments` output to serving_default and translate_nbest.
    `decoder`: the export command's resolved request (`Decoder.from_flags`), instead of
    `model_file`, `beam_size`, `alpha` and `alignments`. `batching` (SavedModel): a
    `Batching`, the in-graph batching of concurrent requests (`export.batching`), or None.
    `warmup` (SavedModel): write TensorFlow Serving's warm-up records (`export.warmup`).
    """
    if format not in FORMATS:
        raise ExportError(f"format={format!r} must be one of {', '.join(FORMATS)}.")
    if quantize not in QUANTIZE_CHOICES[format]:
        raise ExportError(f"quantize={quantize!r} does not apply to the {format} format "
                          f"(choices: {', '.join(QUANTIZE_CHOICES[format])}).")
    if decoder is not None:
        alignments = decoder.request.alignments
    if alignments and (format != "savedmodel" or ids_only):
        raise ExportError("alignments apply to the SavedModel's text signatures: export "
                          "--format savedmodel without --ids-only (a CTranslate2 export "
                          "always returns attention: translate --engine ctranslate2 "
                          "--alignments).")
    if format == "ctranslate2":
        ct2.require_ctranslate2()  # before anything is loaded
    given = {key: value for key, value in (("model", model_file and str(model_file)),
                                           ("beam_size", beam_size), ("alpha", alpha))
             if value is not None}
    try:  # the request's check, and a name fit for a folder
        check(given)
        base_dir = export_base(run_dir, output_dir, name)
    except InputError as error:
        raise ExportError(str(error)) from None
    # The export command's decoder has the run open already.
    if decoder is None:
        decoder = Decoder.resolve(open_run(run_dir), given, command=EXPORT)
    run = decoder.run
    if format != "savedmodel":  # an ensemble exports as one SavedModel only
        single_run(run, f"a {format} export")
    model = decoder.load_model()
    choice = decoder.request
    tokenizer, max_input_length = run.tokenizer(), run.config.max_length
    if format == "ctranslate2":
        folder = ctranslate2_folder(run_dir, quantize, output_dir, name)
        return ct2.export_ctranslate2(model, tokenizer, folder, quantize, max_input_length,
                                      overwrite)
    if format == "savedmodel":
        return export_saved_model(model, tokenizer, base_dir, version, overwrite,
                                  max_input_length, ids_only, choice.beam_size, choice.alpha,
                                  alignments=alignments, batching=batching,
                                  languages=run.config.target_languages or (),
                                  warmup=warmup)
    return export_tflite(model, tokenizer, base_dir / "tflite", quantize, choice.beam_size,
                         choice.alpha, max_input_length, overwrite)
