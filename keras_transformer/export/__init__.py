"""Export for serving: a SavedModel for TensorFlow Serving, a TFLite translator and a
CTranslate2 folder (run by `decoding.engines.ctranslate2`).

    graph.py         the exported graphs around decoding's search bodies (request checks)
    batching.py      concurrent requests searched together in the graph (BatchFunction)
    saved_model.py   SavedModel: the text signatures and translate_ids (ids) signatures
    warmup.py        TensorFlow Serving's warm-up records, one request per signature
    text_signatures.py  serving_default, translate_nbest, sample, score (text in, text out)
    tflite.py        TFLite: one sentence of ids -> ids, builtin ops, optional quantization
    ct2.py           CTranslate2: the weights as its TransformerSpec, float32/int8/float16

`export_run` exports the run a decoder decodes (`decoding.decoder.Decoder`: the model and
search chosen for it); `export_base` and `ctranslate2_folder` (`defaults`) say where a run's
exports go.
"""

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
from keras_transformer.runs.ensemble import single_run

FORMATS = ("savedmodel", "tflite", "ctranslate2")
QUANTIZE_CHOICES = {"savedmodel": ("none",), "tflite": QUANTIZATIONS,
                    "ctranslate2": ct2.QUANTIZATIONS}
# Each format's weights when none is asked for: CTranslate2's users run int8 on CPUs (what
# `demo` writes and the CTranslate2 engine takes first); the others stay float32.
DEFAULT_QUANTIZE = {"savedmodel": "none", "tflite": "none", "ctranslate2": "int8"}


def export_run(decoder, format="savedmodel", quantize=None, output_dir=EXPORT_DIR,
               name=None, version=None, overwrite=False, ids_only=False, batching=Batching(),
               warmup=True):
    """Exports the run a decoder decodes, with its model and search; returns the path written.

        decoder = Decoder.resolve(open_run("runs/multi30k-en-de"), command=EXPORT)
        export_run(decoder)                             # saved_models/multi30k-en-de/1/
        export_run(decoder, "ctranslate2")              # .../ctranslate2-int8/
        export_run(decoder, "ctranslate2", "none")      # .../ctranslate2/ (float32)

    `decoder`: a `decoding.decoder.Decoder` of a run (the export command's,
    `Decoder.from_flags(args, EXPORT)`; in Python `Decoder.resolve(run, given,
    command=EXPORT)`): its model file (a value given, else the run's saved choice, else the
    run's newest model), and its request's beam_size, alpha and alignments. beam_size and
    alpha fix the TFLite search; in a SavedModel they are the default inputs of its
    signatures, and beam_size the beam of its translate_ids_xla signature. `alignments`
    (SavedModel only, not ids_only) adds the `alignments` output to serving_default and
    translate_nbest.

    SavedModel: OUTPUT_DIR/NAME/VERSION/. TFLite: OUTPUT_DIR/NAME/tflite/*.tflite.
    CTranslate2: OUTPUT_DIR/NAME/ctranslate2[-QUANTIZE]/ (replaced with `overwrite`).
    NAME defaults to the run directory's name. `batching` (SavedModel): a `Batching`, the
    in-graph batching of concurrent requests (`export.batching`), or None. `warmup`
    (SavedModel): write TensorFlow Serving's warm-up records (`export.warmup`).
    """
    if format not in FORMATS:
        raise ExportError(f"format={format!r} must be one of {', '.join(FORMATS)}.")
    quantize = DEFAULT_QUANTIZE[format] if quantize is None else quantize
    if quantize not in QUANTIZE_CHOICES[format]:
        raise ExportError(f"quantize={quantize!r} does not apply to the {format} format "
                          f"(choices: {', '.join(QUANTIZE_CHOICES[format])}).")
    run, choice = decoder.run, decoder.request
    if run is None:
        raise ExportError("export_run exports a run: give the decoder of one "
                          "(Decoder.resolve(open_run(RUN_DIR), command=EXPORT)).")
    if choice.alignments and (format != "savedmodel" or ids_only):
        raise ExportError("alignments apply to the SavedModel's text signatures: export "
                          "--format savedmodel without --ids-only (a CTranslate2 export "
                          "always returns attention: translate --engine ctranslate2 "
                          "--alignments).")
    if format == "ctranslate2":
        ct2.require_ctranslate2()  # before anything is loaded
    try:  # a name fit for a folder
        base_dir = export_base(run.directory, output_dir, name)
    except InputError as error:
        raise ExportError(str(error)) from None
    if format != "savedmodel":  # an ensemble exports as one SavedModel only
        single_run(run, f"a {format} export")
    model = decoder.load_model()
    tokenizer, max_input_length = run.tokenizer(), run.config.max_length
    if format == "ctranslate2":
        folder = ctranslate2_folder(run.directory, quantize, output_dir, name)
        return ct2.export_ctranslate2(model, tokenizer, folder, quantize, max_input_length,
                                      overwrite)
    if format == "savedmodel":
        return export_saved_model(model, tokenizer, base_dir, version, overwrite,
                                  max_input_length, ids_only, choice.beam_size, choice.alpha,
                                  alignments=choice.alignments, batching=batching,
                                  languages=run.config.target_languages or (),
                                  warmup=warmup)
    return export_tflite(model, tokenizer, base_dir / "tflite", quantize, choice.beam_size,
                         choice.alpha, max_input_length, overwrite)
