"""Export for serving: a SavedModel for TensorFlow Serving and a TFLite translator.

SavedModel (TensorFlow Serving layout `saved_models/<name>/<version>/`), two signatures:

* `serving_default`: `sentences` (N,) string [, `beam_size` () int32 = 4, `alpha` () float32
  = 0.6] -> `translations` (N,) string, `scores` (N,) float32. Tokenization and
  detokenization run in the graph (tensorflow-text sentencepiece). `beam_size` and `alpha`
  have defaults recorded in the SignatureDef, so a request may leave them out.
* `translate_ids`: `source_ids` (N, S) int32 (subword ids ending with EOS = 2, padded with
  0) [, `beam_size`, `alpha`] -> `ids` (N, T) int32 (ending with EOS, padded with 0),
  `scores` (N,) float32. Core TensorFlow ops only; with `ids_only=True` the SavedModel holds
  nothing else and loads on a server without the tensorflow-text kernels.

Both apply the rules of the in-process `Translator`: whitespace normalized, inputs longer than
`max_input_length` tokens (EOS included) truncated, an empty input translates to "" (ids: just
EOS) with score 0, and a batch of 0 sentences gives 0 results.

TFLite: `source_ids` (1, S) int32 -> `ids` (1, T) int32 and `score` (1,) float32 with a fixed
search (beam 4 and alpha 0.6 by default, or greedy), builtin TFLite ops only, the weights as
constants; float32, dynamic-range int8 or float16 weights. The sentencepiece model is written
beside it for tokenizing on the device.

Every artifact is written to a temporary name in the destination directory and renamed when
complete, so an interrupted export leaves no partial version behind.
"""

import logging
import os
import pathlib
import re
import shutil
import tempfile
import time
import types

import tensorflow as tf

from keras_transformer.beam_search import beam_search, trim
from keras_transformer.errors import UserError
from keras_transformer.search import greedy_search, model_step
from pipelines.special_ids import EOS_ID, PAD_ID

log = logging.getLogger(__name__)

DEFAULT_BEAM_SIZE = 4
DEFAULT_ALPHA = 0.6
QUANTIZATIONS = ("none", "dynamic", "float16")
TMP_PREFIX = ".tmp-"


class ExportError(UserError):
    """An export that cannot be done as asked (existing version, bad option)."""


def _prepare_ids(source_ids, max_input_length):
    """Truncates rows longer than max_input_length (EOS kept last); returns (ids, empty rows).

    A row is empty when it holds no token other than PAD and EOS.
    """
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    is_token = tf.logical_and(tf.not_equal(source_ids, PAD_ID), tf.not_equal(source_ids, EOS_ID))
    empty = tf.logical_not(tf.reduce_any(is_token, axis=1))
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, PAD_ID), tf.int32), axis=1)
    ids = source_ids[:, :max_input_length]
    last = tf.equal(tf.range(tf.shape(ids)[1]), max_input_length - 1)[None, :]
    ids = tf.where(tf.logical_and(last, (lengths > max_input_length)[:, None]), EOS_ID, ids)
    # At least one column, so that a batch of 0 rows (or of empty rows) has a valid shape.
    ids = tf.pad(ids, [[0, 0], [0, tf.maximum(0, 1 - tf.shape(ids)[1])]])
    return ids, empty


def _check_search_options(beam_size, alpha):
    beam_size = tf.convert_to_tensor(beam_size, tf.int32)
    alpha = tf.convert_to_tensor(alpha, tf.float32)
    checks = [
        tf.debugging.assert_greater_equal(beam_size, 1, message="beam_size must be >= 1"),
        tf.debugging.assert_less_equal(beam_size, 64, message="beam_size must be <= 64"),
        tf.debugging.assert_greater_equal(alpha, 0.0, message="alpha must be >= 0"),
    ]
    with tf.control_dependencies(checks):
        return tf.identity(beam_size), tf.identity(alpha)


def search_ids(model, source_ids, beam_size, alpha, max_input_length):
    """Best hypothesis per row: (ids (N, T) int32, scores (N,) float32); empty rows give EOS."""
    beam_size, alpha = _check_search_options(beam_size, alpha)
    ids, empty = _prepare_ids(source_ids, max_input_length)
    step_fn, state, limits, max_length = model_step(model, ids, beam_size)
    result = beam_search(step_fn, state, limits, beam_size, alpha, max_length)
    return _empty_rows_to_eos(result["ids"][:, 0, :], result["scores"][:, 0], empty)


def _empty_rows_to_eos(best, scores, empty):
    """Empty inputs translate to just EOS with score 0; columns of padding trimmed."""
    # At least one column, so that every row can end with EOS.
    best = tf.pad(best, [[0, 0], [0, tf.maximum(0, 1 - tf.shape(best)[1])]])
    eos_only = tf.equal(tf.range(tf.shape(best)[1]), 0)
    best = tf.where(empty[:, None], tf.where(eos_only, EOS_ID, PAD_ID)[None, :], best)
    return trim(best), tf.where(empty, 0.0, scores)


def normalize_text(sentences):
    """In-graph `normalize_whitespace`: ASCII spaces stripped at both ends, runs collapsed."""
    sentences = tf.strings.regex_replace(sentences, " +", " ")
    return tf.strings.regex_replace(sentences, "^ | $", "")


class IdsTranslatorModule(tf.Module):
    """A SavedModel with the `translate_ids` signature only (no tensorflow-text ops).

    Args:
        model: a trained `Transformer`.
        max_input_length: longer inputs are truncated (subword tokens, EOS included).
    """

    def __init__(self, model, max_input_length=256):
        super().__init__(name="translator")
        if max_input_length < 2:
            raise ExportError(f"max_input_length={max_input_length} must be at least 2.")
        # Not tracked as is: TensorFlow's object graph would save the Keras variable wrappers,
        # while the functions capture the tf.Variables inside them, which a TF1-style loader
        # (TensorFlow Serving, saved_model_cli run) then finds uninitialized. `track_variables`
        # tracks exactly the variables the signatures use instead (as keras.export does).
        self._parts = types.SimpleNamespace(model=model)
        self.max_input_length = max_input_length

    @property
    def model(self):
        return self._parts.model

    @tf.function(input_signature=[
        tf.TensorSpec([None, None], tf.int32, name="source_ids"),
        tf.TensorSpec([], tf.int32, name="beam_size"),
        tf.TensorSpec([], tf.float32, name="alpha"),
    ])
    def translate_ids(self, source_ids, beam_size=tf.constant(DEFAULT_BEAM_SIZE),
                      alpha=tf.constant(DEFAULT_ALPHA)):
        ids, scores = search_ids(self.model, source_ids, beam_size, alpha, self.max_input_length)
        return {"ids": ids, "scores": scores}

    def signatures(self):
        return {"translate_ids": self.translate_ids}

    def track_variables(self):
        """Tracks the tf.Variables that the traced signatures capture (call before saving)."""
        seen, variables = set(), []
        for function in self.signatures().values():
            for variable in function.get_concrete_function().variables:
                if id(variable) not in seen:
                    seen.add(id(variable))
                    variables.append(variable)
        self.model_variables = variables
        return variables


class TranslatorModule(IdsTranslatorModule):
    """The full SavedModel: `serving_default` (text in, text out) and `translate_ids`.

    Args:
        model: a trained `Transformer`.
        tokenizer: its `SubwordTokenizer`.
        max_input_length: longer inputs are truncated (subword tokens, EOS included).
    """

    def __init__(self, model, tokenizer, max_input_length=256):
        super().__init__(model, max_input_length)
        self.tokenizer = tokenizer

    @tf.function(input_signature=[
        tf.TensorSpec([None], tf.string, name="sentences"),
        tf.TensorSpec([], tf.int32, name="beam_size"),
        tf.TensorSpec([], tf.float32, name="alpha"),
    ])
    def serve(self, sentences, beam_size=tf.constant(DEFAULT_BEAM_SIZE),
              alpha=tf.constant(DEFAULT_ALPHA)):
        tokens = self.tokenizer.tokenize(normalize_text(sentences))
        tokens = tokens[:, : self.max_input_length - 1]
        eos = tf.fill([tokens.nrows(), 1], EOS_ID)
        source_ids = tf.concat([tokens, tf.RaggedTensor.from_tensor(eos)], axis=1)
        source_ids = source_ids.to_tensor(default_value=PAD_ID)
        ids, scores = search_ids(self.model, source_ids, beam_size, alpha,
                                 self.max_input_length)
        translations = self.tokenizer.detokenize_dense(ids)
        empty = tf.equal(tokens.row_lengths(), 0)
        return {"translations": tf.where(empty, "", translations), "scores": scores}

    def signatures(self):
        return {"serving_default": self.serve, "translate_ids": self.translate_ids}


# -- files -------------------------------------------------------------------------------------


def _clean_stale(directory):
    """Removes temporary directories/files left by exports that were killed."""
    for path in pathlib.Path(directory).glob(TMP_PREFIX + "*"):
        try:
            pid = int(path.name.split("-")[-1].split(".")[0])
        except ValueError:
            pid = None
        if pid is not None and _alive(pid):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _alive(pid):
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def existing_versions(base_dir):
    """Numeric version directories under base_dir (what TensorFlow Serving loads)."""
    base_dir = pathlib.Path(base_dir)
    if not base_dir.is_dir():
        return []
    return sorted(int(p.name) for p in base_dir.iterdir() if p.is_dir() and p.name.isdigit())


def export_saved_model(model, tokenizer, base_dir, version=None, overwrite=False,
                       max_input_length=256, ids_only=False):
    """Writes a SavedModel to base_dir/<version>/ atomically; returns its path.

    Args:
        version: integer version directory; default one more than the highest existing (1).
        overwrite: replace an existing version (otherwise an error).
    """
    base_dir = pathlib.Path(base_dir)
    base_dir.mkdir(parents=True, exist_ok=True)
    _clean_stale(base_dir)
    versions = existing_versions(base_dir)
    if version is None:
        version = (versions[-1] + 1) if versions else 1
    if version < 0:
        raise ExportError(f"--version must be a non-negative integer; got {version}.")
    target = base_dir / str(version)
    if target.exists() and not overwrite:
        raise ExportError(
            f"{target} already exists: TensorFlow Serving may be serving it. Choose another "
            "--version, or pass --overwrite to replace it.")
    module = (IdsTranslatorModule(model, max_input_length) if ids_only
              else TranslatorModule(model, tokenizer, max_input_length))
    temporary = base_dir / f"{TMP_PREFIX}{version}-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()  # from here on, everything goes under the temporary name
    start = time.time()
    try:
        module.track_variables()
        tf.saved_model.save(module, str(temporary), signatures=module.signatures())
        if not ids_only:
            # The sentencepiece model, for clients that tokenize themselves (translate_ids).
            _write_bytes(temporary / "assets.extra" / "spm.model", tokenizer.model_proto)
        if target.exists():
            old = base_dir / f"{TMP_PREFIX}old-{version}-{os.getpid()}"
            os.replace(target, old)
            os.replace(temporary, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(temporary, target)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    log.info("SavedModel written to %s in %.1f s", target, time.time() - start)
    return target


def _write_bytes(path, data):
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f"{TMP_PREFIX}{path.name}-{os.getpid()}")
    temporary.write_bytes(data)
    os.replace(temporary, path)
    return path


# -- TFLite ------------------------------------------------------------------------------------


class TFLiteTranslator(tf.Module):
    """One sentence of ids -> ids with a fixed search, for conversion to TFLite.

    Args:
        model: a trained `Transformer`.
        beam_size: 1 runs greedy search; otherwise beam search (paper: 4).
        alpha: length penalty (beam search only).
        max_input_length: longer inputs are truncated.
    """

    def __init__(self, model, beam_size=DEFAULT_BEAM_SIZE, alpha=DEFAULT_ALPHA,
                 max_input_length=256):
        super().__init__(name="tflite_translator")
        self._parts = types.SimpleNamespace(model=model)
        self.beam_size, self.alpha = int(beam_size), float(alpha)
        self.max_input_length = max_input_length

    @tf.function(input_signature=[tf.TensorSpec([1, None], tf.int32, name="source_ids")])
    def translate(self, source_ids):
        model = self._parts.model
        ids, empty = _prepare_ids(source_ids, self.max_input_length)
        if self.beam_size == 1:
            step_fn, state, limits, max_length = model_step(model, ids, 1)
            best, scores = greedy_search(step_fn, state, limits, max_length)
        else:
            step_fn, state, limits, max_length = model_step(model, ids, self.beam_size)
            result = beam_search(step_fn, state, limits, self.beam_size, self.alpha, max_length)
            best, scores = result["ids"][:, 0, :], result["scores"][:, 0]
        best, scores = _empty_rows_to_eos(best, scores, empty)
        return {"ids": best, "score": scores}

    def track_variables(self):
        self.model_variables = list(self.translate.get_concrete_function().variables)


def convert_tflite(model, quantize="none", beam_size=DEFAULT_BEAM_SIZE, alpha=DEFAULT_ALPHA,
                   max_input_length=256):
    """The TFLite flatbuffer (bytes) of `TFLiteTranslator`; builtin ops only.

    quantize: "none" (float32), "dynamic" (int8 weights, float activations) or "float16"
    (float16 weights).
    """
    if quantize not in QUANTIZATIONS:
        raise ExportError(f"--quantize must be one of {', '.join(QUANTIZATIONS)}; got {quantize!r}.")
    module = TFLiteTranslator(model, beam_size, alpha, max_input_length)
    module.track_variables()
    with tempfile.TemporaryDirectory() as tmp:
        # Converting from a SavedModel freezes the variables read inside the search loop.
        tf.saved_model.save(module, tmp, signatures={"serving_default": module.translate})
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


def export_tflite(model, tokenizer, output_dir, quantize="none", beam_size=DEFAULT_BEAM_SIZE,
                  alpha=DEFAULT_ALPHA, max_input_length=256, overwrite=False):
    """Writes output_dir/translator-<search>-<quantization>.tflite and spm.model beside it."""
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    _clean_stale(output_dir)
    target = output_dir / tflite_filename(beam_size, quantize)
    if target.exists() and not overwrite:
        raise ExportError(f"{target} already exists; pass --overwrite to replace it.")
    start = time.time()
    data = convert_tflite(model, quantize, beam_size, alpha, max_input_length)
    _write_bytes(output_dir / "spm.model", tokenizer.model_proto)
    _write_bytes(target, data)
    log.info("TFLite model written to %s (%.1f MB) in %.1f s", target, len(data) / 1e6,
             time.time() - start)
    return target


def export_run(run_dir, format="savedmodel", quantize="none", output_dir="saved_models",
               name=None, version=None, overwrite=False, beam_size=DEFAULT_BEAM_SIZE,
               alpha=DEFAULT_ALPHA, model_file=None, ids_only=False):
    """Exports a training run (averaged.keras if present, else model.keras); returns the path.

    SavedModel: OUTPUT_DIR/NAME/VERSION/. TFLite: OUTPUT_DIR/NAME/tflite/*.tflite.
    NAME defaults to the run directory's name.
    """
    from keras_transformer.translate import load_run

    if format not in ("savedmodel", "tflite"):
        raise ExportError(f"--format must be savedmodel or tflite; got {format!r}.")
    if format == "savedmodel" and quantize != "none":
        raise ExportError("--quantize applies to --format tflite only.")
    if beam_size < 1:
        raise ExportError(f"--beam must be at least 1; got {beam_size}.")
    name = name or os.path.basename(os.path.abspath(run_dir))
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ExportError(f"--name {name!r}: use letters, digits, '.', '_' and '-' only.")
    model, tokenizer, config = load_run(run_dir, model_file)
    max_input_length = int(config.get("max_length", 256))
    base_dir = pathlib.Path(output_dir) / name
    if format == "savedmodel":
        return export_saved_model(model, tokenizer, base_dir, version, overwrite,
                                  max_input_length, ids_only)
    return export_tflite(model, tokenizer, base_dir / "tflite", quantize, beam_size, alpha,
                         max_input_length, overwrite)


def signature_op_types(saved_model_dir, signature="translate_ids"):
    """Op types a signature of a SavedModel runs, including those inside nested functions
    (while-loop bodies, partitioned calls)."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    proto.ParseFromString((pathlib.Path(saved_model_dir) / "saved_model.pb").read_bytes())
    graph = proto.meta_graphs[0]
    if signature not in graph.signature_def:
        raise ExportError(f"{saved_model_dir} has no signature {signature!r}; it has "
                          f"{', '.join(sorted(graph.signature_def))}.")
    functions = {f.signature.name: f for f in graph.graph_def.library.function}
    nodes = {node.name: node for node in graph.graph_def.node}
    ops, seen, pending = set(), set(), []

    def visit(node):
        ops.add(node.op)
        if node.op in functions:
            pending.append(node.op)
        for attr in node.attr.values():
            names = [attr.func.name] if attr.HasField("func") else [
                f.name for f in attr.list.func]
            pending.extend(name for name in names if name)

    # The signature's outputs, and everything they depend on in the outer graph.
    stack = [t.name.split(":")[0] for t in graph.signature_def[signature].outputs.values()]
    while stack:
        name = stack.pop().lstrip("^").split(":")[0]
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        visit(nodes[name])
        stack.extend(nodes[name].input)
    done = set()
    while pending:
        name = pending.pop()
        if name in done or name not in functions:
            continue
        done.add(name)
        for node in functions[name].node_def:
            visit(node)
    return sorted(ops)
