"""The search as an exported graph runs it: the same rules as the in-process `Translator`
(whitespace normalized, long inputs truncated, an empty input gives just EOS with score 0, a
batch of 0 sentences gives 0 results), written with core TensorFlow ops only.

The searches themselves are `decoding`'s bodies (`translate_beam`, `translate_sample`,
`score_ids`), the ones `Translator` runs; this module adds what belongs to a served request:
the in-graph truncation of its ids (`prepare_ids`), the checks below and the XLA signature's
padding of widths.

A request is checked before anything is searched: each option in its range (the decoding
request's, `decoding.request.RANGES`: a NaN fails every check), and at most `max_rows` rows
searched at once (sentences x beam_size, or x num_samples) or 16 x max_rows target positions
scored, since memory grows with rows x length. A failed
check is an InvalidArgument error naming the input and its value; the server goes on with the
next request.
"""

import tensorflow as tf

from keras_transformer.decoding.search.beam_search import translate_beam
from keras_transformer.decoding.search.compiling import XLA_WIDTH_STEP
from keras_transformer.decoding.request import DEFAULTS, MAX_CONSTRAINTS, RANGES
from keras_transformer.decoding.search.rules import trim
from keras_transformer.decoding.search.sampling import translate_sample
from keras_transformer.decoding.search.scoring import score_ids
from keras_transformer.errors import InputError
from pipelines.special_ids import EOS_ID, PAD_ID, UNK_ID

MAX_BEAM = 64  # the largest beam_size, num_hypotheses or num_samples a request may ask for
# Rows one request may search (sentences x beam_size or num_samples). Each row holds its
# self-attention cache and its share of the encoder output: 2 (keys, values) x num_layers x
# d_model x (input + output positions) x 4 bytes, 14 MB for the base model at the longest
# inputs (256 input, 306 output positions), so 1024 rows stay within about 15 GB even then;
# 0.6 MB for the demo's 3-layer d_model-256 model at Multi30k lengths (0.6 GB for 1024 rows).
MAX_ROWS = 1024
# Scoring holds the logits of every target position at once, 4 x vocabulary bytes each (and
# their log-softmax): a request may score at most this many target positions per row of the
# search bound (pairs x the longest target's tokens <= 16 x max_rows; 2.4 GB of logits at a
# 37,000-piece vocabulary, 0.5 GB at 8,000).
SCORE_POSITIONS_PER_ROW = 16


def graph_function(function=None, **options):
    """`tf.function` without AutoGraph, for the export's signatures and searches (a decorator,
    with or without options). Their loops and branches are written as ops (the searches are
    `keras.ops` code that JAX runs too), so AutoGraph has nothing to convert; it only wraps
    each call it meets while tracing, and that cost 40% of an export's time (a tiny Multi30k
    model's SavedModel: 17 s without, 30 s with; the saved graph is the same, node for node)."""
    return tf.function(function, autograph=False, **options)


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


def _require(condition, message, *values):
    """An assertion that fails the request with `message` and the offending values."""
    return tf.debugging.Assert(condition, [message, *values])


def _checked(checks, *tensors):
    """The tensors, available only once every check has passed."""
    with tf.control_dependencies(checks):
        return [tf.identity(t) for t in tensors]


def rows_check(sentences, per_sentence, what, max_rows=MAX_ROWS):
    """At most max_rows = sentences x per_sentence rows (int64: no overflow)."""
    rows = tf.cast(sentences, tf.int64) * tf.cast(per_sentence, tf.int64)
    return _require(rows <= max_rows, f"a request may search at most {max_rows} rows "
                    f"(sentences x {what}): send fewer sentences per request; got sentences, "
                    f"{what} =", sentences, per_sentence)


def in_range(name, value):
    """The decoding request's range of option `name` (`decoding.request.RANGES`, declared
    once) as a graph check of the tensor `value`; a NaN fails it. A bound beyond the dtype
    (seed < 2**31 in int32) holds by itself and is left out."""
    bounds = RANGES[name]
    holds = tf.constant(True)
    if bounds.low is not None:
        low = tf.cast(bounds.low, value.dtype)
        holds = tf.logical_and(holds, value > low if bounds.low_open else value >= low)
    if bounds.high is not None and bounds.high <= value.dtype.max:
        high = tf.cast(bounds.high, value.dtype)
        holds = tf.logical_and(holds, value < high if bounds.high_open else value <= high)
    return _require(holds, f"{name} must be {bounds.rule()}; got", value)


def _check_search_options(beam_size, alpha, sentences=None, max_rows=MAX_ROWS):
    beam_size = tf.convert_to_tensor(beam_size, tf.int32)
    alpha = tf.convert_to_tensor(alpha, tf.float32)
    checks = [
        in_range("beam_size", beam_size),
        _require(beam_size <= MAX_BEAM, f"beam_size must be <= {MAX_BEAM}; got", beam_size),
        in_range("alpha", alpha),
    ]
    if sentences is not None:
        with tf.control_dependencies(checks):  # the rows only once beam_size is known good
            checks.append(rows_check(sentences, beam_size, "beam_size", max_rows))
    return _checked(checks, beam_size, alpha)


def check_sampling_options(num_samples, top_k, top_p, temperature, seed, sentences,
                           max_rows=MAX_ROWS):
    """The sampling inputs, once each is in the decoding request's range (`in_range`) and
    num_samples within MAX_BEAM."""
    num_samples, top_k, seed = (tf.convert_to_tensor(v, tf.int32)
                                for v in (num_samples, top_k, seed))
    top_p, temperature = (tf.convert_to_tensor(v, tf.float32) for v in (top_p, temperature))
    values = dict(num_samples=num_samples, top_k=top_k, top_p=top_p, temperature=temperature,
                  seed=seed)
    checks = [in_range(name, value) for name, value in values.items()]
    checks.append(_require(num_samples <= MAX_BEAM, f"num_samples must be <= {MAX_BEAM}; got",
                           num_samples))
    with tf.control_dependencies(checks):
        checks.append(rows_check(sentences, num_samples, "num_samples", max_rows))
    return _checked(checks, num_samples, top_k, top_p, temperature, seed)


def no_repetition_controls():
    """The repetition controls' inputs at their defaults, (no_repeat_ngram_size,
    repetition_penalty) int32 and float32 scalars: off."""
    return (tf.constant(DEFAULTS["no_repeat_ngram_size"], tf.int32),
            tf.constant(DEFAULTS["repetition_penalty"], tf.float32))


def check_repetition(repetition):
    """The repetition controls' inputs (no_repeat_ngram_size, repetition_penalty), once each
    is in the decoding request's range; None: their defaults (off)."""
    if repetition is None:
        return no_repetition_controls()
    ngram_size = tf.convert_to_tensor(repetition[0], tf.int32)
    penalty = tf.convert_to_tensor(repetition[1], tf.float32)
    return tuple(_checked([in_range("no_repeat_ngram_size", ngram_size),
                           in_range("repetition_penalty", penalty)], ngram_size, penalty))


def repetition_off(repetition):
    """A scalar bool: the repetition controls (tensors, or None) are both at their defaults."""
    if repetition is None:
        return tf.constant(True)
    off = no_repetition_controls()
    return tf.logical_and(tf.equal(tf.cast(repetition[0], tf.int32), off[0]),
                          tf.equal(tf.cast(repetition[1], tf.float32), off[1]))


def check_prefix(prefix, sentences):
    """(N, P) prefix ids, or None; one row per sentence."""
    if prefix is None:
        return None
    rows = tf.shape(prefix)[0]
    check = _require(tf.equal(rows, sentences), "prefixes must give one entry per sentence "
                     "(or none at all); got sentences, prefixes =", sentences, rows)
    return _checked([check], prefix)[0]


def check_constraints(constraints, sentences, beam_size, max_phrase_tokens):
    """(N, C, L) constraint ids (`decoding.search.beam_search`'s), or None: one entry per
    sentence (or none at all), at most MAX_CONSTRAINTS phrases a sentence, each at most
    max_phrase_tokens subword tokens and none of them the unknown piece, and a beam of 2 or
    more where any is given."""
    if constraints is None:
        return None
    shape = tf.shape(constraints)
    given = tf.reduce_any(tf.not_equal(constraints, PAD_ID))
    phrases = tf.reduce_sum(tf.cast(tf.reduce_any(tf.not_equal(constraints, PAD_ID), axis=2),
                                    tf.int32), axis=1)
    checks = [
        _require(tf.logical_or(tf.equal(shape[0], sentences), tf.logical_not(given)),
                 "constraints must give one entry per sentence (or none at all); got "
                 "sentences, constraints =", sentences, shape[0]),
        _require(tf.reduce_all(phrases <= MAX_CONSTRAINTS), f"constraints: a sentence may "
                 f"have at most {MAX_CONSTRAINTS} phrases; got", tf.reduce_max(
                     tf.concat([phrases, [0]], 0))),
        _require(shape[2] <= max_phrase_tokens, f"constraints: a phrase may have at most "
                 f"{max_phrase_tokens} subword tokens; the longest has", shape[2]),
        _require(tf.logical_not(tf.reduce_any(tf.equal(constraints, UNK_ID))),
                 "constraints: a phrase holds a piece the model's vocabulary does not know "
                 "(the unknown piece): it cannot be written; rephrase it"),
        _require(tf.logical_or(tf.logical_not(given), beam_size >= 2),
                 "constraints need beam search: beam_size must be 2 or more; got", beam_size),
    ]
    return _checked(checks, constraints)[0]


def search_ids(model, source_ids, beam_size, alpha, max_input_length, max_rows=MAX_ROWS,
               prefix=None, constraints=None, unconstrained=None, repetition=None):
    """Best hypothesis per row: (ids (N, T) int32, scores (N,) float32); empty rows give EOS.
    prefix: (N, P) int32 ids each output starts with (rows of 0: none); constraints: (N, C, L)
    int32 phrases every output holds (all 0: none; `check_constraints`); unconstrained,
    repetition: as for `nbest_ids`."""
    ids, scores = nbest_ids(model, source_ids, beam_size, alpha, 1, max_input_length, max_rows,
                            prefix, constraints, unconstrained, repetition)
    return ids[:, 0, :], scores[:, 0]


def nbest_ids(model, source_ids, beam_size, alpha, num_hypotheses, max_input_length,
              max_rows=MAX_ROWS, prefix=None, constraints=None, unconstrained=None,
              repetition=None):
    """The num_hypotheses best of the beam per row: (ids (N, H, T), scores (N, H)), best first.

    An empty row gives EOS with score 0 first; places the search's pool did not fill (and an
    empty row's others) hold no tokens and the score NEG_INF (-1e9).

    unconstrained: the search of a request without constraints, `(source_ids, beam_size,
    alpha, num_hypotheses, prefix (N, P), no_repeat_ngram_size, repetition_penalty) -> (ids,
    scores)`: an export's traced function that all its beam searches call
    (`unconstrained_search`), so that the graph holds it once; None: traced here.
    repetition: the repetition controls' scalar tensors (no_repeat_ngram_size,
    repetition_penalty), checked in their ranges (`check_repetition`); None: off. Tensors:
    the search holds their rules under a cond per step, which a request at the defaults
    skips (`decoding.search.repetition`).
    """
    if constraints is None and unconstrained is not None:  # it checks the request itself
        return unconstrained(source_ids, beam_size, alpha, num_hypotheses,
                             _prefix_or_none(prefix, source_ids), *check_repetition(repetition))
    source_ids, beam_size, alpha, num_hypotheses, prefix = check_nbest_request(
        source_ids, beam_size, alpha, num_hypotheses, prefix, max_rows)
    controls = {} if repetition is None else dict(zip(
        ("no_repeat_ngram_size", "repetition_penalty"), check_repetition(repetition)))
    constraints = check_constraints(constraints, tf.shape(source_ids)[0], beam_size,
                                    max_input_length)
    ids, empty = prepare_ids(source_ids, max_input_length)

    def search(constraints=None):
        # Without constraints, a request without prefixes runs the search without their
        # per-step masking (a cond); with them, the masked search runs either way (a row of
        # zeros is no prefix: it finds the same), so that it is traced once.
        result = translate_beam(model, ids, beam_size, alpha, prefix=prefix,
                                num_hypotheses=num_hypotheses, empty_rows=empty,
                                optional_prefix=constraints is None, constraints=constraints,
                                **controls)
        return result["ids"], result["scores"]

    def without_constraints():
        if unconstrained is None:
            return search()
        return unconstrained(source_ids, beam_size, alpha, num_hypotheses,
                             _prefix_or_none(prefix, source_ids), *check_repetition(repetition))

    if constraints is None:
        return search()
    # A request without constraints runs today's search, without their bookkeeping.
    return tf.cond(tf.reduce_any(tf.not_equal(constraints, PAD_ID)),
                   lambda: search(constraints), without_constraints)


def _prefix_or_none(prefix, source_ids):
    """The prefix, or (N, 1) zeros (no prefix for any row) where there is none."""
    if prefix is not None:
        return prefix
    return tf.zeros([tf.shape(source_ids)[0], 1], tf.int32)


def unconstrained_search(model, max_input_length, max_rows=MAX_ROWS):
    """`nbest_ids` without constraints as one traced function (`graph_function`), for the
    `unconstrained` argument: an export's signatures and its batched search call it, so that
    the search (with its prefix branch) is traced and saved once, not once per caller."""
    def search(source_ids, beam_size, alpha, num_hypotheses, prefix, no_repeat_ngram_size,
               repetition_penalty):
        return nbest_ids(model, source_ids, beam_size, alpha, num_hypotheses, max_input_length,
                         max_rows, prefix,
                         repetition=(no_repeat_ngram_size, repetition_penalty))

    return graph_function(search, input_signature=[
        tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([], tf.int32),
        tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32),
        tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([], tf.int32),
        tf.TensorSpec([], tf.float32)])


def check_nbest_request(source_ids, beam_size, alpha, num_hypotheses, prefix=None,
                        max_rows=MAX_ROWS):
    """A beam search request's tensors (source_ids, beam_size, alpha, num_hypotheses,
    prefix), available once every check has passed (before anything is searched)."""
    sentences = tf.shape(source_ids)[0]
    beam_size, alpha = _check_search_options(beam_size, alpha, sentences, max_rows)
    num_hypotheses = tf.convert_to_tensor(num_hypotheses, tf.int32)
    num_hypotheses, source_ids = _checked([
        _require(num_hypotheses >= 1, "num_hypotheses must be >= 1; got", num_hypotheses),
        _require(num_hypotheses <= beam_size, "num_hypotheses must be <= beam_size; got "
                 "num_hypotheses, beam_size =", num_hypotheses, beam_size)],
        num_hypotheses, source_ids)
    return source_ids, beam_size, alpha, num_hypotheses, check_prefix(prefix, sentences)


def sample_ids(model, source_ids, num_samples, top_k, top_p, temperature, seed,
               max_input_length, max_rows=MAX_ROWS, prefix=None):
    """num_samples random translations per row (`decoding.search.sampling`): (ids (N, S, T), scores
    (N, S) log P(Y | X)). An empty row's samples are empty, with score 0."""
    sentences = tf.shape(source_ids)[0]
    num_samples, top_k, top_p, temperature, seed = check_sampling_options(
        num_samples, top_k, top_p, temperature, seed, sentences, max_rows)
    prefix = check_prefix(prefix, sentences)
    ids, empty = prepare_ids(source_ids, max_input_length)
    result = translate_sample(model, ids, num_samples, top_k, top_p, temperature, seed,
                              prefix=prefix, empty_rows=empty)
    return result["ids"], result["scores"]


def score_target_ids(model, source_ids, target_ids, max_input_length, max_target_length,
                     max_rows=MAX_ROWS):
    """log P(target | source) per pair: {"log_prob", "tokens", "mean"} (N,) each.

    target_ids: (N, T) int32 ending with EOS, 0-padded; at most max_target_length tokens (a
    longer target is refused: a truncated one would get another sentence's score), and N x T
    at most SCORE_POSITIONS_PER_ROW x max_rows.
    """
    sentences = tf.shape(source_ids)[0]
    tokens = tf.reduce_sum(tf.cast(tf.not_equal(target_ids, PAD_ID), tf.int32), axis=1)
    longest = tf.reduce_max(tf.concat([tokens, [0]], axis=0))
    positions = SCORE_POSITIONS_PER_ROW * max_rows
    source_ids, target_ids = _checked([
        _require(tf.equal(tf.shape(target_ids)[0], sentences), "targets must give one "
                 "target per source; got sources, targets =", sentences,
                 tf.shape(target_ids)[0]),
        _require(longest <= max_target_length, f"targets must be at most {max_target_length} "
                 "subword tokens with EOS; the longest has", longest),
        _require(tf.cast(sentences, tf.int64) * tf.cast(longest, tf.int64) <= positions,
                 f"a request may score at most {positions} target positions (pairs x the "
                 "longest target's subword tokens): send fewer or shorter pairs per request; "
                 "got pairs, longest =", sentences, longest)], source_ids, target_ids)
    ids, _ = prepare_ids(source_ids, max_input_length)
    target_ids = tf.pad(target_ids, [[0, 0], [0, tf.maximum(0, 1 - tf.shape(target_ids)[1])]])
    result = score_ids(model, ids, target_ids)
    tokens = result["tokens"]
    mean = result["log_prob"] / tf.cast(tf.maximum(tokens, 1), tf.float32)
    return {"log_prob": result["log_prob"], "tokens": tokens, "mean": mean}


def xla_search_ids(model, beam_size, max_input_length, width_step=XLA_WIDTH_STEP,
                   max_rows=MAX_ROWS):
    """`search_ids` with the beam size fixed and the search loop compiled by XLA.

    Returns a function (source_ids, alpha) -> (ids, scores). XLA compiles once per input
    shape: widths are padded to a multiple of `width_step` here, so a server compiles once per
    (batch size, width bucket) and then reuses it.
    """

    @graph_function(jit_compile=True)
    def search(ids, alpha, empty):
        result = translate_beam(model, ids, beam_size, alpha, num_hypotheses=1,
                                empty_rows=empty, static=True)
        return result["ids"], result["scores"]

    def run(source_ids, alpha):
        _, alpha = _check_search_options(beam_size, alpha, tf.shape(source_ids)[0], max_rows)
        ids, empty = prepare_ids(source_ids, max_input_length)
        width = tf.shape(ids)[1]
        ids = tf.pad(ids, [[0, 0], [0, (width_step - width % width_step) % width_step]])
        best, scores = search(ids, alpha, empty)
        return trim(best[:, 0, :]), scores[:, 0]  # the padding columns cut outside XLA

    return run


def normalize_text(sentences):
    """In-graph `normalize_whitespace`: ASCII spaces stripped at both ends, runs collapsed."""
    sentences = tf.strings.regex_replace(sentences, " +", " ")
    return tf.strings.regex_replace(sentences, "^ | $", "")
