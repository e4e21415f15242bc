"""The search as an exported graph runs it: the same rules as the in-process `Translator`
(whitespace normalized, long inputs truncated, an empty input gives just EOS with score 0, a
batch of 0 sentences gives 0 results), written with core TensorFlow ops only."""

import tensorflow as tf

from keras_transformer.decoding.beam_search import beam_search, trim
from keras_transformer.decoding.search import XLA_WIDTH_STEP, model_step, static_max_length
from keras_transformer.defaults import TRANSLATION
from keras_transformer.errors import InputError
from pipelines.special_ids import EOS_ID, PAD_ID


class ExportError(InputError):
    """An export that cannot be done as asked (existing version, bad option)."""


def prepare_ids(source_ids, max_input_length):
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
    ids, empty = prepare_ids(source_ids, max_input_length)
    step_fn, state, limits, max_length = model_step(model, ids, beam_size)
    result = beam_search(step_fn, state, limits, beam_size, alpha, max_length)
    return empty_rows_to_eos(result["ids"][:, 0, :], result["scores"][:, 0], empty)


def xla_search_ids(model, beam_size, max_input_length, width_step=XLA_WIDTH_STEP):
    """`search_ids` with the beam size fixed and the search loop compiled by XLA.

    Returns a function (source_ids, alpha) -> (ids, scores). XLA compiles once per input
    shape: widths are padded to a multiple of `width_step` here, so a server compiles once per
    (batch size, width bucket) and then reuses it.
    """

    @tf.function(jit_compile=True)
    def search(ids, alpha):
        step_fn, state, limits, max_length = model_step(
            model, ids, beam_size, static_max_length(ids, TRANSLATION.extra_length))
        result = beam_search(step_fn, state, limits, beam_size, alpha, max_length)
        return result["ids"][:, 0, :], result["scores"][:, 0]

    def run(source_ids, alpha):
        _, alpha = _check_search_options(beam_size, alpha)
        ids, empty = prepare_ids(source_ids, max_input_length)
        width = tf.shape(ids)[1]
        ids = tf.pad(ids, [[0, 0], [0, (width_step - width % width_step) % width_step]])
        best, scores = search(ids, alpha)
        return empty_rows_to_eos(best, scores, empty)

    return run


def empty_rows_to_eos(best, scores, empty):
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
