"""Requests batched inside the SavedModel: concurrent requests to one loaded model searched
together by TensorFlow's BatchFunction op (`tf.nondifferentiable_batch_function`).

A 3-sentence beam search is mostly per-step overhead (each step runs the same ops for 12
rows as for 120), so a server answering requests one by one leaves most of its CPU to
dispatch. The BatchFunction op queues the calls of one function made concurrently in one
loaded graph (a TF1 Session's `run` from several threads, as TensorFlow Serving calls it, or
a `tf.saved_model.load`ed function called from several threads), concatenates their inputs
along axis 0, runs the function once on the whole batch and splits its outputs back along
axis 0, so each call gets the rows it sent.

What may meet in one batch. The BatchFunction concatenates whatever it was given, so only
the tensors that concatenate meaningfully go in: a request's source ids and prefix ids, one
row per sentence, each padded to the fixed width `max_input_length` (the longest either can
be after the graph's truncation) and trimmed back to the batch's widest row inside. Every row
of a batch is searched with one set of options, the export's own: a request is batched only
when its `beam_size` and `alpha` are the export's defaults (what a request that leaves them
out gets) and it has 1 to `max_batch_size` sentences; any other request takes the unbatched
search, exactly as an export without batching runs it. What differs per request and is
exact per row rides along: prefixes (a row of zeros is no prefix, and a search with
prefixes finds the same for such a row as one without), `num_hypotheses` (the batched
search keeps the whole beam, each request takes its first num_hypotheses). A request is
checked (`graph.check_nbest_request`) before it joins a batch, so a bad request fails alone.

Exact per-row answers: each row's output limit is its own (source length + 50, + its
prefix), an empty row gets EOS by its own flag, and padding columns are masked; what a
batch changes is only the width of the padded matmuls and softmaxes (sums in another order:
scores can move in the last bits, ~1e-7).
"""

import dataclasses
import uuid

import tensorflow as tf

from keras_transformer.defaults import BATCH_MAX_ROWS, BATCH_THREADS, BATCH_TIMEOUT_MS
from keras_transformer.export.graph import (
    ExportError, check_nbest_request, nbest_ids, no_repetition_controls, repetition_off)
from keras_transformer.decoding.search.rules import trim
from pipelines.special_ids import PAD_ID

FILENAME = "batching_parameters.txt"  # in the version's assets.extra/ (see `parameters_text`)


@dataclasses.dataclass(frozen=True)
class Batching:
    """The BatchFunction's settings, fixed at export (`keras-transformer export
    --batch-max-rows N --batch-timeout-ms T`; `--no-batching` exports without).

    Args:
        max_rows: the most sentences one batched search holds (the BatchFunction's
            max_batch_size; sentences x beam_size must stay within the export's max_rows);
            a request of more sentences takes the unbatched search.
        timeout_ms: how long the first request of a batch waits for others to join
            (batch_timeout_micros / 1000). A lone request waits this long: it is the
            latency added at low load.
        num_threads: batches searched at once (num_batch_threads). One on a small CPU
            server: a batch already uses every core.
        max_enqueued_batches: batches that may wait; past it a request fails with
            UNAVAILABLE rather than queue without bound.
    """

    max_rows: int = BATCH_MAX_ROWS
    timeout_ms: float = BATCH_TIMEOUT_MS
    num_threads: int = BATCH_THREADS
    max_enqueued_batches: int = 100

    def __post_init__(self):
        for name in ("max_rows", "num_threads", "max_enqueued_batches"):
            if int(getattr(self, name)) < 1:
                raise ExportError(f"batching {name}={getattr(self, name)} must be at least 1.")
        if not self.timeout_ms >= 0:
            raise ExportError(f"batching timeout_ms={self.timeout_ms} must be at least 0.")

    @property
    def timeout_micros(self):
        return int(round(self.timeout_ms * 1000))

    def parameters_text(self):
        """The same settings as the text proto TensorFlow Serving's
        `--enable_batching --batching_parameters_file FILE` reads (BatchingParameters).

        No allowed_batch_sizes: they pad a batch up to the next allowed size, which helps a
        graph compiled per shape; this one runs any batch size as it comes.
        """
        return (f"max_batch_size {{ value: {self.max_rows} }}\n"
                f"batch_timeout_micros {{ value: {self.timeout_micros} }}\n"
                f"num_batch_threads {{ value: {self.num_threads} }}\n"
                f"max_enqueued_batches {{ value: {self.max_enqueued_batches} }}\n")


class BatchedSearch:
    """`graph.nbest_ids` for a module's text signatures, with the requests that use the
    export's default options searched in batches (see the module docstring).

    Args:
        model: the `Transformer` (or `Ensemble`).
        beam_size, alpha: the export's defaults: the options of every batched search.
        max_input_length, max_rows: the module's (truncation; rows one search may hold).
        batching: a `Batching`.
        unconstrained: the module's search of a request without constraints
            (`graph.unconstrained_search`), which the batches and the requests searched alone
            both call.
    """

    def __init__(self, model, beam_size, alpha, max_input_length, max_rows, batching,
                 unconstrained):
        if batching.max_rows * beam_size > max_rows:
            raise ExportError(
                f"batch max rows {batching.max_rows} x beam_size {beam_size} must be at most "
                f"max_rows={max_rows} (the rows one search may hold).")
        self.model, self.beam_size, self.alpha = model, int(beam_size), float(alpha)
        self.max_input_length, self.max_rows = max_input_length, max_rows
        self.batching = batching
        self.unconstrained = unconstrained
        # The batcher is a resource named after this scope in the loading process's resource
        # manager: unique per export, so that two models loaded in one process (one
        # tf.saved_model.load each) never share a queue.
        self.scope = f"batched_search_{uuid.uuid4().hex[:12]}"
        self._search = tf.nondifferentiable_batch_function(
            batching.num_threads, batching.max_rows, batching.timeout_micros,
            max_enqueued_batches=batching.max_enqueued_batches, autograph=False,
            enable_large_batch_splitting=False)(self._search_batch)  # as `graph_function`

    def _search_batch(self, source_ids, prefix):
        """The whole batch: (B, max_input_length) ids and prefixes, trimmed to the batch's
        widest row, searched with the export's options; the whole beam kept."""
        source_ids, prefix = _at_least_one_column(trim(source_ids)), _at_least_one_column(
            trim(prefix))
        return self.unconstrained(source_ids, self.beam_size, self.alpha, self.beam_size,
                                  prefix, *no_repetition_controls())

    def __call__(self, source_ids, beam_size, alpha, num_hypotheses, prefix, constraints=None,
                 repetition=None):
        """As `graph.nbest_ids(model, source_ids, beam_size, alpha, num_hypotheses, ...,
        prefix, constraints, repetition)`: (ids (N, H, T), scores (N, H)). A request with
        constraints, or with a repetition control on, is searched alone (the batches search
        with the export's defaults)."""
        source_ids, beam_size, alpha, num_hypotheses, prefix = check_nbest_request(
            source_ids, beam_size, alpha, num_hypotheses, prefix, self.max_rows)
        sentences = tf.shape(source_ids)[0]
        batched = tf.logical_and(
            tf.logical_and(tf.equal(beam_size, self.beam_size), tf.equal(alpha, self.alpha)),
            tf.logical_and(sentences > 0, sentences <= self.batching.max_rows))
        batched = tf.logical_and(batched, repetition_off(repetition))
        if constraints is not None:
            batched = tf.logical_and(batched, tf.logical_not(tf.reduce_any(
                tf.not_equal(constraints, PAD_ID))))

        def in_a_batch():
            width = self.max_input_length
            with tf.name_scope(self.scope):
                ids, scores = self._search(_padded(source_ids, width), _padded(prefix, width))
            # The op's outputs have no static shape: (N, beam_size, T) and (N, beam_size).
            ids = tf.ensure_shape(ids, [None, self.beam_size, None])
            scores = tf.ensure_shape(scores, [None, self.beam_size])
            return trim(ids[:, :num_hypotheses]), scores[:, :num_hypotheses]

        def alone():
            return nbest_ids(self.model, source_ids, beam_size, alpha, num_hypotheses,
                             self.max_input_length, self.max_rows, prefix, constraints,
                             self.unconstrained, repetition)

        return tf.cond(batched, in_a_batch, alone)


def _padded(ids, width):
    """(N, <= width) int32 -> (N, width), PAD on the right."""
    ids = ids[:, :width]
    return tf.pad(ids, [[0, 0], [0, width - tf.shape(ids)[1]]], constant_values=PAD_ID)


def _at_least_one_column(ids):
    return tf.pad(ids, [[0, 0], [0, tf.maximum(0, 1 - tf.shape(ids)[1])]])
