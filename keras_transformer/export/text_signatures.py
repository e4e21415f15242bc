"""The text signatures of the full SavedModel: strings in, strings out, tokenized in the graph
(tensorflow-text sentencepiece), with the search rules of `export.graph`.

* `serving_default`: sentences (N,) [, beam_size, alpha, prefixes (N,) or (0,), constraints
  (N,) or (0,), no_repeat_ngram_size, repetition_penalty] -> translations (N,), scores (N,)
  length-normalized.
* `translate_nbest`: sentences [, beam_size, alpha, num_hypotheses, prefixes, constraints,
  no_repeat_ngram_size, repetition_penalty] -> translations (N, H), scores (N, H), best first
  (H = num_hypotheses <= beam_size).
* `sample`: sentences [, num_samples, top_k, top_p, temperature, seed, prefixes] ->
  translations (N, S), scores (N, S) log P(translation | sentence).
* `score`: sources (N,), targets (N,) -> log_prob (N,) natural-log total, tokens (N,) target
  subword tokens with EOS, mean (N,) log_prob / tokens.

An export of a run of several target languages has one more optional input in each of them,
`target_language` ((N,) or (1,) string, default the run's first target: `export.languages`).

Exported with alignments (`export --alignments`), `serving_default` and `translate_nbest`
also output `alignments`, (N,) or (N, H) string: each translation's word alignment in Pharaoh
format ("0-0 2-1": source word - target word), by the rule of `decoding.search.alignment` (the
cross-attention of the chosen layer and heads, pieces gathered into words, in the graph), the
same strings `Translator.translate(..., alignments=True)` gives.

`prefixes`: an empty vector (the default) means none; otherwise one string per sentence, each
output starting with its subword tokens ("" for none), truncated to max_input_length tokens.
`constraints`: the same; each string is the sentence's target phrases separated by tabs
("" for none, empty phrases ignored), each phrase in every translation of it (lexically
constrained beam search, `decoding.search.beam_search`); checked by `export.graph`
(`check_constraints`: at most MAX_CONSTRAINTS phrases, each of at most max_input_length
tokens, none spelled with the unknown piece, a beam of 2 or more).
`no_repeat_ngram_size` (int32, default 0) and `repetition_penalty` (float32, default 1.0):
the repetition controls (`decoding.search.repetition`), off by default, checked in the
request's ranges; a request that turns one on is searched alone, never batched.
The beam searches of `serving_default` and `translate_nbest` are the module's
(`search_ids`, `nbest_ids`): batched across concurrent requests when exported with batching
(`export.batching`; a request with constraints is searched alone). Each signature is made per
module, so that the defaults of its optional inputs are the export's (kept in the saved
functions and the SignatureDefs). The options' inputs, their dtypes and the defaults the
export does not choose (sampling) come from the decoding request (`decoding.request`), where
every option is declared once.
"""

import tensorflow as tf

from keras_transformer.decoding.search.alignment import align_ids, pharaoh_graph, starts_word_table
from keras_transformer.decoding.request import DEFAULTS, signature_input
from keras_transformer.export.graph import (
    graph_function, normalize_text, sample_ids, score_target_ids)
from keras_transformer.export.languages import (
    TARGET_LANGUAGE, default_language, tagged_sentences, untag_alignments)
from pipelines.special_ids import EOS_ID, PAD_ID

SENTENCES = tf.TensorSpec([None], tf.string, name="sentences")
PREFIXES = tf.TensorSpec([None], tf.string, name="prefixes")
NO_PREFIXES = ()  # the default `prefixes`: an empty vector
CONSTRAINTS = tf.TensorSpec([None], tf.string, name="constraints")
NO_CONSTRAINTS = ()  # the default `constraints`: an empty vector


def option(name):
    """The input of a request option: a scalar TensorSpec named after it (int32 or float32,
    `request.signature_input`)."""
    return tf.TensorSpec([], signature_input(name)[0], name=name)


def default(name):
    """The request's default of option `name`, as the constant a signature defaults to."""
    kind, value = signature_input(name)
    return tf.constant(value, kind)


# The repetition controls (`decoding.search.repetition`), optional inputs of the beam
# searches' signatures, last (after target_language where there is one): off by default.
REPETITION = [option("no_repeat_ngram_size"), option("repetition_penalty")]


def _with_eos(tokens):
    """Ragged (N, None) ids -> (N, S) int32 ending with EOS, 0-padded."""
    eos = tf.RaggedTensor.from_tensor(tf.fill([tokens.nrows(), 1], EOS_ID))
    return tf.concat([tokens, eos], axis=1).to_tensor(default_value=PAD_ID)


def source_ids(module, sentences):
    """(N,) strings -> ((N, S) ids truncated to max_input_length with EOS, (N,) empty)."""
    tokens = module.tokenizer.tokenize(normalize_text(sentences))
    tokens = tokens[:, : module.max_input_length - 1]
    return _with_eos(tokens), tf.equal(tokens.row_lengths(), 0)


def prefix_ids(module, prefixes, sentences):
    """(M,) prefix strings -> (M, P) ids without EOS, 0-padded; M = 0 gives (N, 1) zeros (no
    prefix for any of the N sentences)."""
    tokens = module.tokenizer.tokenize(normalize_text(prefixes))[:, : module.max_input_length]
    return tf.cond(tf.size(prefixes) > 0, lambda: tokens.to_tensor(default_value=PAD_ID),
                   lambda: tf.zeros([tf.size(sentences), 1], tf.int32))


def constraint_ids(module, constraints, sentences):
    """(M,) tab-separated phrases -> (M, C, L) ids without EOS, 0-padded (an empty phrase
    dropped); M = 0 gives (N, 1, 1) zeros (no constraint for any of the N sentences)."""
    phrases = tf.strings.split(constraints, "\t")  # (M, None) ragged
    phrases = tf.ragged.map_flat_values(normalize_text, phrases)
    phrases = tf.ragged.boolean_mask(phrases, tf.not_equal(phrases, ""))
    tokens = module.tokenizer.tokenize(phrases.flat_values)  # (phrases, None)
    grouped = tf.RaggedTensor.from_row_splits(tokens, phrases.row_splits)
    dense = grouped.to_tensor(default_value=PAD_ID)
    dense = tf.pad(dense, [[0, 0], [0, tf.maximum(0, 1 - tf.shape(dense)[1])],
                          [0, tf.maximum(0, 1 - tf.shape(dense)[2])]])
    return tf.cond(tf.size(constraints) > 0, lambda: dense,
                   lambda: tf.zeros([tf.size(sentences), 1, 1], tf.int32))


def detokenize(module, ids):
    """(N, H, T) ids -> (N, H) strings."""
    shape = tf.shape(ids)
    flat = tf.reshape(ids, [shape[0] * shape[1], shape[2]])
    return tf.reshape(module.tokenizer.detokenize_dense(flat), shape[:2])


def starts_word(tokenizer):
    """The (V,) table of the pieces that start a word (`alignment.starts_word_table`)."""
    from pipelines.vocabulary import Vocabulary

    return starts_word_table(Vocabulary(tokenizer.model_proto).pieces())


def alignments(module, ids, hypotheses):
    """(N, S) source ids and (N, H, T) hypotheses -> (N, H) Pharaoh strings, in the graph."""
    shape = tf.shape(hypotheses)
    flat = tf.reshape(hypotheses, [shape[0] * shape[1], shape[2]])

    def widened(rows):  # at least one column: a request of 0 sentences has none
        return tf.pad(rows, [[0, 0], [0, tf.maximum(0, 1 - tf.shape(rows)[1])]])

    links = align_ids(module.model, widened(tf.repeat(ids, shape[1], axis=0)), widened(flat),
                      module.starts_word)
    return tf.reshape(pharaoh_graph(links), shape[:2])


def serving_default(module):
    def body(sentences, beam_size, alpha, prefixes, constraints, repetition, untag=False):
        ids, empty = source_ids(module, sentences)
        best, scores = module.search_ids(ids, beam_size, alpha,
                                         prefix_ids(module, prefixes, sentences),
                                         constraint_ids(module, constraints, sentences),
                                         repetition)
        translations = module.tokenizer.detokenize_dense(best)
        outputs = {"translations": tf.where(empty, "", translations), "scores": scores}
        if module.starts_word is not None:
            outputs["alignments"] = _untagged(
                alignments(module, ids, best[:, None, :])[:, 0], untag)
        return outputs

    if module.languages:
        @graph_function(input_signature=[SENTENCES, option("beam_size"), option("alpha"),
                                         PREFIXES, CONSTRAINTS, TARGET_LANGUAGE, *REPETITION])
        def serve_languages(sentences, beam_size=tf.constant(module.beam_size),
                            alpha=tf.constant(module.alpha),
                            prefixes=tf.constant(NO_PREFIXES, tf.string),
                            constraints=tf.constant(NO_CONSTRAINTS, tf.string),
                            target_language=default_language(module),
                            no_repeat_ngram_size=default("no_repeat_ngram_size"),
                            repetition_penalty=default("repetition_penalty")):
            return body(tagged_sentences(module, sentences, target_language), beam_size,
                        alpha, prefixes, constraints,
                        (no_repeat_ngram_size, repetition_penalty), untag=True)

        return serve_languages

    @graph_function(input_signature=[SENTENCES, option("beam_size"), option("alpha"), PREFIXES,
                                     CONSTRAINTS, *REPETITION])
    def serve(sentences, beam_size=tf.constant(module.beam_size),
              alpha=tf.constant(module.alpha), prefixes=tf.constant(NO_PREFIXES, tf.string),
              constraints=tf.constant(NO_CONSTRAINTS, tf.string),
              no_repeat_ngram_size=default("no_repeat_ngram_size"),
              repetition_penalty=default("repetition_penalty")):
        return body(sentences, beam_size, alpha, prefixes, constraints,
                    (no_repeat_ngram_size, repetition_penalty))

    return serve


def _untagged(lines, untag):
    return untag_alignments(lines) if untag else lines


def translate_nbest(module):
    def body(sentences, beam_size, alpha, num_hypotheses, prefixes, constraints, repetition,
             untag=False):
        ids, empty = source_ids(module, sentences)
        hypotheses, scores = module.nbest_ids(ids, beam_size, alpha, num_hypotheses,
                                              prefix_ids(module, prefixes, sentences),
                                              constraint_ids(module, constraints, sentences),
                                              repetition)
        outputs = {"translations": detokenize(module, hypotheses), "scores": scores}
        if module.starts_word is not None:
            outputs["alignments"] = _untagged(alignments(module, ids, hypotheses), untag)
        return outputs

    specs = [SENTENCES, option("beam_size"), option("alpha"),
             tf.TensorSpec([], tf.int32, name="num_hypotheses"), PREFIXES, CONSTRAINTS]
    if module.languages:
        @graph_function(input_signature=specs + [TARGET_LANGUAGE, *REPETITION])
        def nbest_languages(sentences, beam_size=tf.constant(module.beam_size),
                            alpha=tf.constant(module.alpha),
                            num_hypotheses=tf.constant(module.beam_size),
                            prefixes=tf.constant(NO_PREFIXES, tf.string),
                            constraints=tf.constant(NO_CONSTRAINTS, tf.string),
                            target_language=default_language(module),
                            no_repeat_ngram_size=default("no_repeat_ngram_size"),
                            repetition_penalty=default("repetition_penalty")):
            return body(tagged_sentences(module, sentences, target_language), beam_size,
                        alpha, num_hypotheses, prefixes, constraints,
                        (no_repeat_ngram_size, repetition_penalty), untag=True)

        return nbest_languages

    @graph_function(input_signature=specs + REPETITION)
    def nbest(sentences, beam_size=tf.constant(module.beam_size),
              alpha=tf.constant(module.alpha), num_hypotheses=tf.constant(module.beam_size),
              prefixes=tf.constant(NO_PREFIXES, tf.string),
              constraints=tf.constant(NO_CONSTRAINTS, tf.string),
              no_repeat_ngram_size=default("no_repeat_ngram_size"),
              repetition_penalty=default("repetition_penalty")):
        return body(sentences, beam_size, alpha, num_hypotheses, prefixes, constraints,
                    (no_repeat_ngram_size, repetition_penalty))

    return nbest


def sample(module):
    def body(sentences, num_samples, top_k, top_p, temperature, seed, prefixes):
        ids, _ = source_ids(module, sentences)
        samples, scores = sample_ids(
            module.model, ids, num_samples, top_k, top_p, temperature, seed,
            module.max_input_length, module.max_rows, prefix_ids(module, prefixes, sentences))
        return {"translations": detokenize(module, samples), "scores": scores}

    specs = [SENTENCES, option("num_samples"), option("top_k"), option("top_p"),
             option("temperature"), option("seed"), PREFIXES]
    if module.languages:
        @graph_function(input_signature=specs + [TARGET_LANGUAGE])
        def sample_languages(sentences, num_samples=default("num_samples"),
                             top_k=default("top_k"), top_p=default("top_p"),
                             temperature=default("temperature"), seed=default("seed"),
                             prefixes=tf.constant(NO_PREFIXES, tf.string),
                             target_language=default_language(module)):
            return body(tagged_sentences(module, sentences, target_language), num_samples,
                        top_k, top_p, temperature, seed, prefixes)

        return sample_languages

    @graph_function(input_signature=specs)
    def sample_fn(sentences, num_samples=default("num_samples"), top_k=default("top_k"),
                  top_p=default("top_p"), temperature=default("temperature"),
                  seed=default("seed"), prefixes=tf.constant(NO_PREFIXES, tf.string)):
        return body(sentences, num_samples, top_k, top_p, temperature, seed, prefixes)

    return sample_fn


def score(module):
    def body(sources, targets):
        ids, _ = source_ids(module, sources)
        target_ids = _with_eos(module.tokenizer.tokenize(normalize_text(targets)))
        return score_target_ids(module.model, ids, target_ids, module.max_input_length,
                                module.max_input_length + DEFAULTS["extra_length"],
                                module.max_rows)

    specs = [tf.TensorSpec([None], tf.string, name="sources"),
             tf.TensorSpec([None], tf.string, name="targets")]
    if module.languages:
        @graph_function(input_signature=specs + [TARGET_LANGUAGE])
        def score_languages(sources, targets, target_language=default_language(module)):
            return body(tagged_sentences(module, sources, target_language), targets)

        return score_languages

    @graph_function(input_signature=specs)
    def score_fn(sources, targets):
        return body(sources, targets)

    return score_fn
