"""TensorFlow Serving's warm-up records (keras_transformer/export/warmup.py) on SignatureDefs
built here; the records of real exports are replayed in tests/test_serving_tf1.py."""

import pytest

from keras_transformer.export import ExportError, warmup


def test_warm_up_requests_fill_every_input_and_skip_what_a_cpu_server_cannot_run():
    import tensorflow as tf
    from tensorflow.core.protobuf import meta_graph_pb2

    def signature(**inputs):
        made = meta_graph_pb2.SignatureDef(method_name="tensorflow/serving/predict")
        for alias, (dtype, rank) in inputs.items():
            made.inputs[alias].dtype = dtype.as_datatype_enum
            made.inputs[alias].tensor_shape.dim.extend([made.inputs[alias].tensor_shape.Dim(
                size=-1)] * rank)
        return made

    text = signature(sentences=(tf.string, 1), beam_size=(tf.int32, 0))
    text.defaults["beam_size"].CopyFrom(tf.make_tensor_proto(4, tf.int32))
    ids = signature(source_ids=(tf.int32, 2))
    logs = warmup.warmup_logs({"serving_default": text, "translate_ids": ids,
                               "translate_ids_xla": ids, "__saved_model_init_op": signature()},
                              source_ids=[7, 8, 2])
    requests = {log.predict_log.request.model_spec.signature_name:
                {k: tf.make_ndarray(v) for k, v in log.predict_log.request.inputs.items()}
                for log in logs}
    assert sorted(requests) == ["serving_default", "translate_ids"]
    assert requests["serving_default"]["sentences"].tolist() == [warmup.SENTENCE.encode()]
    assert requests["serving_default"]["beam_size"] == 4
    assert requests["translate_ids"]["source_ids"].tolist() == [[7, 8, 2]]
    with pytest.raises(ExportError, match="'temperature' of signature 'sample'.*--no-warmup"):
        warmup.warmup_logs({"sample": signature(temperature=(tf.float32, 0))})
