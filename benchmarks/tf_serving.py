"""TensorFlow Serving's Predict handler, emulated: the export loaded into a TF1 Session (as
TF Serving runs it) or with tf.saved_model.load, each request's absent inputs filled from the
SignatureDef's defaults. Imports only TensorFlow and tensorflow-text (in its classes), so that
a fresh process uses it as TF Serving would (tests/test_serving_tf1.py; benchmarks/
serving_load.py and benchmarks/constraints.py send requests through it).
"""

import pathlib


class PredictError(ValueError):
    """A request TensorFlow Serving's Predict handler refuses (INVALID_ARGUMENT there)."""


def signature_defs(export_dir):
    """{name: SignatureDef} of a SavedModel, read from its saved_model.pb (no loading)."""
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel.FromString(
        (pathlib.Path(export_dir) / "saved_model.pb").read_bytes())
    return dict(proto.meta_graphs[0].signature_def)


def warmup_requests(export_dir):
    """[(signature name, {input: numpy value})] of an export's warm-up records
    (assets.extra/tf_serving_warmup_requests: PredictionLog TFRecords, tensorflow-serving-api),
    in their order; [] when it has none."""
    import tensorflow as tf
    from tensorflow_serving.apis import prediction_log_pb2

    path = pathlib.Path(export_dir) / "assets.extra" / "tf_serving_warmup_requests"
    if not path.is_file():
        return []
    requests = []
    for record in tf.compat.v1.io.tf_record_iterator(str(path)):
        request = prediction_log_pb2.PredictionLog.FromString(record).predict_log.request
        requests.append((request.model_spec.signature_name,
                         {alias: tf.make_ndarray(tensor)
                          for alias, tensor in request.inputs.items()}))
    return requests


def request_feeds(signature, inputs):
    """[(input alias, TensorInfo, value)] for every input of `signature` (a SignatureDef): the
    request's value, else the SignatureDef's default, as TF Serving's Predict handler does
    (predict_util.cc: PreProcessPrediction, then saved_model::GetInputValues).

    Raises PredictError for an input the signature lacks, or one it needs that the request
    does not give and that has no default.
    """
    import numpy as np
    import tensorflow as tf

    extra = sorted(set(inputs) - set(signature.inputs))
    missing = sorted(set(signature.inputs) - set(inputs) - set(signature.defaults))
    if extra or missing:
        raise PredictError(
            f"request inputs {sorted(inputs)} do not fit the signature's inputs "
            f"{sorted(signature.inputs)} (defaults for {sorted(signature.defaults)}): "
            f"unknown {extra}, missing {missing}")
    feeds = []
    for alias, info in sorted(signature.inputs.items()):
        if alias in inputs:
            dtype = tf.as_dtype(info.dtype)
            value = np.asarray(inputs[alias], dtype=object if dtype == tf.string
                               else dtype.as_numpy_dtype)
        else:
            value = tf.make_ndarray(signature.defaults[alias])
        feeds.append((alias, info, value))
    return feeds


class PredictHandler:
    """TensorFlow Serving's Predict handler, emulated: the export loaded once into a TF1
    Session (tags "serve", its init op run by the loader), shared by every calling thread.

    `predict` fills a request's absent inputs from the SignatureDef's defaults, runs the
    signature's outputs (all of them, or those of `output_filter`) by their tensor names and
    returns {alias: numpy value}.

    `intra_op_threads`, `inter_op_threads`: the Session's thread pools, as the server's
    `--tensorflow_intra_op_parallelism` / `--tensorflow_inter_op_parallelism` set them
    (0, their default: TensorFlow's choice, every core). TensorFlow makes a process's pools
    once, for its first Session: a second handler in the process gets the first one's.
    """

    def __init__(self, export_dir, tags=("serve",), intra_op_threads=0, inter_op_threads=0):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (registers the sentencepiece ops)

        self.export_dir = export_dir
        self.graph = tf.Graph()
        self.session = tf.compat.v1.Session(graph=self.graph, config=tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=intra_op_threads,
            inter_op_parallelism_threads=inter_op_threads))
        with self.graph.as_default():
            meta_graph = tf.compat.v1.saved_model.loader.load(self.session, list(tags),
                                                              str(export_dir))
        self.signatures = dict(meta_graph.signature_def)

    def predict(self, inputs, signature_name="serving_default", output_filter=()):
        if signature_name not in self.signatures:
            raise PredictError(f"signature {signature_name!r} not in the export "
                               f"({sorted(self.signatures)})")
        signature = self.signatures[signature_name]
        unknown = sorted(set(output_filter) - set(signature.outputs))
        if unknown:
            raise PredictError(f"outputs {unknown} not in {signature_name!r}'s outputs "
                               f"{sorted(signature.outputs)}")
        aliases = list(output_filter) or sorted(signature.outputs)
        feed = {info.name: value for _, info, value in request_feeds(signature, inputs)}
        values = self.session.run([signature.outputs[a].name for a in aliases], feed)
        return dict(zip(aliases, values))

    def warm_up(self):
        """Runs the export's warm-up records in turn, as TF Serving does when it loads a
        version (a failing one fails the load there: PredictError here); returns the
        signature names run."""
        names = []
        for name, inputs in warmup_requests(self.export_dir):
            self.predict(inputs, name)
            names.append(name)
        return names


class FunctionHandler:
    """A Python server's way: tf.saved_model.load once, the signature called from every
    thread, each absent input taken from the SignatureDef's defaults (read from the export's
    saved_model.pb: a Python call applies none itself). The thread pools as for
    `PredictHandler` (tf.config.threading, before TensorFlow starts: 0 leaves its choice)."""

    def __init__(self, export_dir, intra_op_threads=0, inter_op_threads=0):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401

        if intra_op_threads:
            tf.config.threading.set_intra_op_parallelism_threads(intra_op_threads)
        if inter_op_threads:
            tf.config.threading.set_inter_op_parallelism_threads(inter_op_threads)

        self.tf = tf
        self.signatures = signature_defs(export_dir)
        self.loaded = tf.saved_model.load(str(export_dir))

    def predict(self, inputs, signature_name="serving_default"):
        feeds = request_feeds(self.signatures[signature_name], inputs)
        function = self.loaded.signatures[signature_name]
        result = function(**{alias: self.tf.constant(value) for alias, _, value in feeds})
        return {alias: value.numpy() for alias, value in result.items()}
