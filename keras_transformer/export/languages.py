"""The `target_language` input of a SavedModel of a run of several target languages: (N,)
strings, one per sentence, or (1,) for every sentence; its default (in the saved functions and
the SignatureDefs, as the other defaults) is the run's first target. Each sentence gets its
language's tag in the graph, before it is tokenized (`pipelines.multilingual`: the same text
the Python engines search); a code the export does not translate into fails the request with
a message naming the export's languages. A one-pair run's export has no such input.
"""

import tensorflow as tf

from keras_transformer.export.graph import normalize_text
from pipelines.multilingual import tag

TARGET_LANGUAGE = tf.TensorSpec([None], tf.string, name="target_language")


def default_language(module):
    """The default `target_language`: a vector of the export's first target."""
    return tf.constant([module.languages[0]])


def tagged_sentences(module, sentences, target_language):
    """(N,) sentences with each one's tag in front (an empty sentence stays empty)."""
    languages = tf.constant(list(module.languages))
    count, given = tf.size(sentences), tf.size(target_language)
    sizes = tf.debugging.Assert(
        tf.logical_or(tf.equal(given, 1), tf.equal(given, count)),
        ["target_language must give one language per sentence, or one for all: sentences",
         count, "languages", given])
    with tf.control_dependencies([sizes]):  # one for all: index 0 for every sentence
        language = tf.gather(target_language,
                             tf.range(count) * tf.cast(tf.not_equal(given, 1), tf.int32))
    known = tf.reduce_all(tf.reduce_any(tf.equal(language[:, None], languages[None, :]),
                                        axis=1))
    check = tf.debugging.Assert(known, [
        f"target_language must be one of {', '.join(module.languages)} (one per sentence, or "
        "one for all); got", target_language], summarize=20)
    with tf.control_dependencies([check, sizes]):
        normalized = normalize_text(sentences)
        tags = tf.strings.join(["<2", language, "> "])
        return tf.where(tf.equal(normalized, ""), normalized,
                        tf.strings.join([tags, normalized]))


def untag_alignments(lines):
    """Pharaoh strings of tagged sources, any shape, with the tag (source word 0) taken out:
    its links dropped, the other source indices moved down by one (as
    `pipelines.multilingual.untag_alignment`)."""
    shape = tf.shape(lines)
    links = tf.strings.split(tf.reshape(lines, [-1]), " ")
    links = tf.ragged.boolean_mask(links, tf.not_equal(links, ""))
    parts = tf.strings.split(links.flat_values, "-").to_tensor(default_value="0",
                                                               shape=[None, 2])
    source = tf.strings.to_number(parts[:, 0], tf.int32)
    moved = tf.strings.join([tf.strings.as_string(source - 1), parts[:, 1]], "-")
    rows = tf.RaggedTensor.from_row_splits(moved, links.row_splits)
    keep = tf.RaggedTensor.from_row_splits(source > 0, links.row_splits)
    joined = tf.strings.reduce_join(tf.ragged.boolean_mask(rows, keep), axis=1, separator=" ")
    return tf.reshape(joined, shape)


assert tag("fr") == "<2fr>"  # the graph writes the same tag as `pipelines.multilingual.tag`
