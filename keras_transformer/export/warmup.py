"""TensorFlow Serving's warm-up records: assets.extra/tf_serving_warmup_requests.

A process that loads the SavedModel builds and optimizes a signature's graph the first time
the signature runs: about 10 s for the tiny model of the tests, on 2 cores (docs/export.md),
paid by the first client of each signature, and again by every new version. TensorFlow
Serving replays the requests of this file (TFRecords of `PredictionLog`,
tensorflow-serving-api) when it loads a version, before the version takes traffic, so the
first client is served as fast as the next.

One request per signature the server runs on its CPU kernels: each input its SignatureDef's
default, or a short sentence (its subword ids ending with EOS for `source_ids`). Not
`translate_ids_xla`: a server without `--xla_cpu_compilation_enabled` cannot run it, and a
warm-up request that fails fails the whole load. Every input is given, as TF Serving feeds
a request after filling in the defaults, so that the warm-up runs the graph a request runs.
"""

import pathlib

import numpy as np
import tensorflow as tf

from keras_transformer.export.graph import ExportError
from pipelines.special_ids import EOS_ID

FILENAME = "tf_serving_warmup_requests"  # in the version's assets.extra/, as TF Serving reads
SENTENCE = "A short sentence warms the graph up ."
SKIPPED = ("translate_ids_xla",)  # XLA: only on a server that compiles it (see above)


def saved_meta_graph(saved_model_dir):
    """The MetaGraphDef of a SavedModel (its graph and SignatureDefs), read from its
    saved_model.pb without loading it."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel.FromString(
        (pathlib.Path(saved_model_dir) / "saved_model.pb").read_bytes())
    return proto.meta_graphs[0]


def _value(name, signature_name, info, source_ids):
    """The warm-up value of an input without a default (a sentence, or its ids)."""
    rank = len(info.tensor_shape.dim)
    if info.dtype == tf.string.as_datatype_enum and rank == 1:
        return np.array([SENTENCE.encode("utf-8")], dtype=object)
    if info.dtype == tf.int32.as_datatype_enum and rank == 2:
        return np.array([source_ids], np.int32)
    raise ExportError(f"no warm-up value for input {name!r} of signature {signature_name!r} "
                      f"({tf.as_dtype(info.dtype).name}, rank {rank}): give it a default or "
                      "export with --no-warmup.")


def warmup_logs(signatures, source_ids=(EOS_ID,)):
    """[PredictionLog] of one request per signature in `signatures` ({name: SignatureDef}),
    by name, without the `SKIPPED` ones. `source_ids`: the ids input's row (EOS last)."""
    from tensorflow_serving.apis import prediction_log_pb2

    logs = []
    for name in sorted(signatures):
        signature = signatures[name]
        if name.startswith("__") or name in SKIPPED or not signature.inputs:
            continue
        log = prediction_log_pb2.PredictionLog()
        request = log.predict_log.request
        request.model_spec.signature_name = name
        for alias, info in sorted(signature.inputs.items()):
            if alias in signature.defaults:
                request.inputs[alias].CopyFrom(signature.defaults[alias])
            else:
                request.inputs[alias].CopyFrom(tf.make_tensor_proto(
                    _value(alias, name, info, source_ids)))
        logs.append(log)
    return logs


def write_warmup_requests(saved_model_dir, tokenizer=None):
    """Writes the warm-up records of the SavedModel at `saved_model_dir` (its signatures as
    saved) and returns their path. `tokenizer`: the export's `SubwordTokenizer`, for the
    sentence's ids (without one, the ids input gets a row of EOS only)."""
    source_ids = [EOS_ID]
    if tokenizer is not None:
        source_ids = [int(i) for i in tokenizer.tokenize([SENTENCE])[0].numpy()] + [EOS_ID]
    logs = warmup_logs(dict(saved_meta_graph(saved_model_dir).signature_def), source_ids)
    path = pathlib.Path(saved_model_dir) / "assets.extra" / FILENAME
    path.parent.mkdir(parents=True, exist_ok=True)
    # Inside the export's temporary folder, which is renamed when complete (atomic).
    with tf.io.TFRecordWriter(str(path)) as writer:
        for log in logs:
            writer.write(log.SerializeToString())
    return path
