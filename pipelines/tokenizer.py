"""The shared subword vocabulary inside TensorFlow: tensorflow-text's sentencepiece op as a
tf.Module, so the same object tokenizes in tf.data and inside exported graphs.

The vocabulary itself (training it, the normalization it applies, tokenizing from plain Python)
is `pipelines.vocabulary`; this module is the TensorFlow floor's view of the same model file.
"""

import types

import tensorflow as tf
import tensorflow_text as tf_text

from pipelines.special_ids import EOS_ID, PAD_ID
from pipelines.vocabulary import (  # noqa: F401  (re-exported)
    FILENAME, Vocabulary, normalize_whitespace, processor_of, tokenizer_settings,
    train_vocabulary)
from pipelines.errors import DataError  # noqa: F401

class SubwordTokenizer(tf.Module):
    """A sentencepiece model as a tf.Module: `tokenize` strings, `detokenize` ids.

    Args:
        model_proto: the serialized sentencepiece model (bytes).

    The methods are tf.functions with fixed signatures, so a SavedModel that holds this module
    tokenizes in-graph. The tensorflow-text op is created inside each traced function rather
    than once eagerly: tensorflow-text's sentencepiece resource is owned by an eager kernel and
    vanishes when `tf.random.set_seed` (or `keras.utils.set_random_seed`) clears the eager
    caches; a graph-owned one does not.
    """

    FILENAME = FILENAME

    def __init__(self, model_proto, name=None):
        super().__init__(name=name)
        self.model_proto = bytes(model_proto)
        self.vocab_size = processor_of(self.model_proto).get_piece_size()

    @classmethod
    def load(cls, path):
        return cls(Vocabulary.load(path).model_proto)

    def _op(self):
        return tf_text.SentencepieceTokenizer(model=self.model_proto, out_type=tf.int32)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    def tokenize(self, texts):
        """(N,) strings -> ragged (N, None) int32 ids, without BOS/EOS."""
        return self._op().tokenize(texts)

    @tf.function(input_signature=[tf.RaggedTensorSpec([None, None], tf.int32)], autograph=False)
    def detokenize(self, ids):
        """Ragged (N, None) ids -> (N,) strings. PAD, BOS and EOS decode to nothing."""
        return self._op().detokenize(ids)

    def detokenize_dense(self, ids):
        """(N, T) ids, possibly padded, cut at the first EOS -> (N,) strings."""
        ids = tf.convert_to_tensor(ids, tf.int32)
        keep = tf.math.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32), axis=1, exclusive=True)
        ids = tf.where(keep > 0, PAD_ID, ids)
        return self.detokenize(tf.RaggedTensor.from_tensor(ids, padding=PAD_ID))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)], autograph=False)
    def id_to_piece(self, ids):
        """(N,) ids -> (N,) piece strings (for attention pictures and debugging)."""
        return self._op().id_to_string(ids)


def train_tokenizer(texts, *args, **kwargs):
    """`pipelines.vocabulary.train_vocabulary` (same arguments), as a `SubwordTokenizer`."""
    vocabulary = train_vocabulary(texts, *args, **kwargs)
    tokenizer = SubwordTokenizer(vocabulary.model_proto)
    # A namespace, not a dict: tf.Module would track a dict attribute as part of the module.
    tokenizer.training = types.SimpleNamespace(**vars(vocabulary.training))
    return tokenizer
