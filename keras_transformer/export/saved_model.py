"""SavedModel export for TensorFlow Serving (layout `saved_models/<name>/<version>/`).

Text signatures (`export.text_signatures`; tokenization and detokenization in the graph,
tensorflow-text sentencepiece):

* `serving_default`: `sentences` (N,) string [, `beam_size` () int32, `alpha` () float32,
  `prefixes` (N,) string] -> `translations` (N,) string, `scores` (N,) float32. The optional
  inputs may be left out of a request: their defaults are the export's (the run's decoding
  choice, else beam 4 and alpha 0.6; no prefixes), kept in the saved functions.
* `translate_nbest`: the `num_hypotheses` (<= beam_size) best -> (N, H) translations and scores.
* With `alignments=True` (`export --alignments`; off by default, so the signatures above
  are unchanged), `serving_default` and `translate_nbest` also output `alignments`, (N,) or
  (N, H) string: each translation's word alignment in Pharaoh format, by the rule of
  `decoding.search.alignment` (the same strings as `Translator.translate(..., alignments=True)`).
* `sample`: random sampling (num_samples, top_k, top_p, temperature, seed) -> (N, S).
* `score`: `sources`, `targets` -> `log_prob`, `tokens`, `mean` (N,) each.

Ids signatures (core TensorFlow ops only):

* `translate_ids`: `source_ids` (N, S) int32 (subword ids ending with EOS = 2, padded with
  0) [, `beam_size`, `alpha`] -> `ids` (N, T) int32 (ending with EOS, padded with 0),
  `scores` (N,) float32. With `ids_only=True` the SavedModel holds nothing else and loads on a
  server without the tensorflow-text kernels.
* `translate_ids_xla`: the same search compiled by XLA, with the beam size fixed at export
  (`beam_size` of the export; inputs `source_ids` [, `alpha`]). 2.7x faster per request on
  CPU (a Multi30k model: no per-op overhead, caches updated in place), but TensorFlow
  Serving runs it only with `--xla_cpu_compilation_enabled=true` (experimental), and XLA
  compiles it once per input shape (widths are padded to a multiple of 16 in the graph; the
  first request of each batch size and width bucket takes seconds). `serving_default` and
  `translate_ids` stay the portable default.

Every signature checks its inputs in the graph (`export.graph`) and searches at most
`max_rows` rows per request (sentences x beam_size or num_samples).

A version is written under a temporary name beside it and renamed when complete, so an
interrupted export leaves no partial version behind.
"""

import contextlib
import logging
import pathlib
import time
import types

import tensorflow as tf

from keras_transformer.decoding.request import DEFAULTS
from keras_transformer.defaults import MAX_LENGTH
from keras_transformer.export import batching as batching_module, text_signatures
from keras_transformer.export.batching import Batching, BatchedSearch
from keras_transformer.export.warmup import saved_meta_graph, write_warmup_requests
from keras_transformer.export.graph import (
    MAX_ROWS, ExportError, check_repetition, graph_function, nbest_ids, search_ids,
    unconstrained_search, xla_search_ids)
from keras_transformer.runs.run import atomic_path, remove_stale_temporaries, write_bytes

log = logging.getLogger(__name__)

SOURCE_IDS = tf.TensorSpec([None, None], tf.int32, name="source_ids")


class IdsTranslatorModule(tf.Module):
    """A SavedModel with the `translate_ids` signature only (no tensorflow-text ops).

    Args:
        model: a trained `Transformer`.
        max_input_length: longer inputs are truncated (subword tokens, EOS included).
        beam_size, alpha: the defaults of the signatures' `beam_size` and `alpha` inputs;
            beam_size is also the fixed beam of `translate_ids_xla`.
        max_rows: the most rows one request may search (sentences x beam_size or
            num_samples); a larger request is refused by the graph (`export.graph.MAX_ROWS`).
    """

    def __init__(self, model, max_input_length=MAX_LENGTH, beam_size=DEFAULTS["beam_size"],
                 alpha=DEFAULTS["alpha"], max_rows=MAX_ROWS):
        super().__init__(name="translator")
        self.beam_size, self.alpha = int(beam_size), float(alpha)
        if int(max_rows) < self.beam_size:
            raise ExportError(f"max_rows={max_rows} must be at least beam_size="
                              f"{self.beam_size}.")
        self.max_rows = int(max_rows)
        self.translate_ids = self._translate_ids_function()
        self.translate_ids_xla = self._translate_ids_xla_function()
        if max_input_length < 2:
            raise ExportError(f"max_input_length={max_input_length} must be at least 2.")
        self._xla_search = xla_search_ids(model, beam_size, max_input_length,
                                          max_rows=self.max_rows)
        # Not tracked as is: TensorFlow's object graph would save the Keras variable wrappers,
        # while the functions capture the tf.Variables inside them, which a TF1-style loader
        # (TensorFlow Serving, saved_model_cli run) then finds uninitialized. `track_variables`
        # tracks exactly the variables the signatures use instead (as keras.export does).
        self._parts = types.SimpleNamespace(model=model)
        self.max_input_length = max_input_length
        # The beam search of a request without constraints, traced once and called by every
        # signature that beam-searches and by the batched search (untracked, as the model: a
        # function of the saved graphs, not a saved object). A tiny Multi30k model's full
        # export traced the search 8 times before, 4 now (with the constrained one and XLA's).
        self._parts.search = unconstrained_search(model, max_input_length, self.max_rows)

    @property
    def model(self):
        return self._parts.model

    def nbest_ids(self, source_ids, beam_size, alpha, num_hypotheses, prefix=None,
                  constraints=None, repetition=None):
        """The text signatures' beam search (`graph.nbest_ids` with this export's bounds):
        (ids (N, H, T), scores (N, H)); repetition: (no_repeat_ngram_size,
        repetition_penalty) scalar tensors, or None (off)."""
        return nbest_ids(self.model, source_ids, beam_size, alpha, num_hypotheses,
                         self.max_input_length, self.max_rows, prefix, constraints,
                         self._parts.search, repetition)

    def search_ids(self, source_ids, beam_size, alpha, prefix=None, constraints=None,
                   repetition=None):
        """The best hypothesis of `nbest_ids`: (ids (N, T), scores (N,))."""
        ids, scores = self.nbest_ids(source_ids, beam_size, alpha, 1, prefix, constraints,
                                     repetition)
        return ids[:, 0, :], scores[:, 0]

    # The signatures are made per module, so that their default inputs are this export's.
    def _translate_ids_function(self):
        @graph_function(input_signature=[SOURCE_IDS, text_signatures.option("beam_size"),
                                         text_signatures.option("alpha")])
        def translate_ids(source_ids, beam_size=tf.constant(self.beam_size),
                          alpha=tf.constant(self.alpha)):
            ids, scores = search_ids(self.model, source_ids, beam_size, alpha,
                                     self.max_input_length, self.max_rows,
                                     unconstrained=self._parts.search)
            return {"ids": ids, "scores": scores}

        return translate_ids

    def _translate_ids_xla_function(self):
        @graph_function(input_signature=[SOURCE_IDS, text_signatures.option("alpha")])
        def translate_ids_xla(source_ids, alpha=tf.constant(self.alpha)):
            ids, scores = self._xla_search(source_ids, alpha)
            return {"ids": ids, "scores": scores}

        return translate_ids_xla

    def signatures(self):
        return {"translate_ids": self.translate_ids, "translate_ids_xla": self.translate_ids_xla}

    def track_variables(self, options=None):
        """Tracks the tf.Variables that the traced signatures capture (call before saving).

        The signatures are traced as `tf.saved_model.save(..., options=options)` traces them:
        TensorFlow keys its trace cache on the save context too (its variable policy), so a
        trace made outside it would be made again by the save (twice the export's time).
        """
        seen, variables = set(), []
        with as_when_saving(options):
            functions = [function.get_concrete_function()
                         for function in self.signatures().values()]
        for function in functions:
            for variable in function.variables:
                if id(variable) not in seen:
                    seen.add(id(variable))
                    variables.append(variable)
        self.model_variables = variables
        return variables


class TranslatorModule(IdsTranslatorModule):
    """The full SavedModel: the text signatures (`export.text_signatures`) and the ids ones.

    Args:
        model: a trained `Transformer`.
        tokenizer: its `SubwordTokenizer`.
        max_input_length: longer inputs are truncated (subword tokens, EOS included).
        beam_size, alpha, max_rows: as for `IdsTranslatorModule`.
        alignments: add the `alignments` output to serving_default and translate_nbest.
        batching: a `Batching`: concurrent requests with the default beam_size and alpha are
            searched together (`export.batching`); None: each request alone.
        languages: the targets of a run of several pairs (the first is the default): the
            signatures' `target_language` input (`export.languages`); () for one pair.
    """

    def __init__(self, model, tokenizer, max_input_length=MAX_LENGTH,
                 beam_size=DEFAULTS["beam_size"], alpha=DEFAULTS["alpha"], max_rows=MAX_ROWS,
                 alignments=False, batching=None, languages=()):
        super().__init__(model, max_input_length, beam_size, alpha, max_rows)
        self.tokenizer = tokenizer
        self._parts.languages = tuple(languages)  # untracked: plain values
        # Untracked too: it holds the model (its batcher is an op of the traced graphs).
        self._parts.batched = batching and BatchedSearch(
            model, self.beam_size, self.alpha, max_input_length, self.max_rows, batching,
            self._parts.search)
        # serving_default and translate_nbest call one traced function: the search (its
        # prefix, constraint and batching branches) is traced and saved once, not per
        # signature.
        self._parts.nbest = graph_function(self._traced_nbest, input_signature=[
            tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([], tf.int32),
            tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32),
            tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None, None], tf.int32),
            tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32)])
        # Untracked, as the model (a constant of the graph, not a saved object).
        self._parts.starts_word = text_signatures.starts_word(tokenizer) if alignments else None
        self.serve = text_signatures.serving_default(self)
        self.translate_nbest = text_signatures.translate_nbest(self)
        self.sample = text_signatures.sample(self)
        self.score = text_signatures.score(self)

    def nbest_ids(self, source_ids, beam_size, alpha, num_hypotheses, prefix=None,
                  constraints=None, repetition=None):
        if prefix is None or constraints is None:
            return self._search_nbest(source_ids, beam_size, alpha, num_hypotheses, prefix,
                                      constraints, repetition)
        return self._parts.nbest(source_ids, beam_size, alpha, num_hypotheses, prefix,
                                 constraints, *check_repetition(repetition))

    def _traced_nbest(self, source_ids, beam_size, alpha, num_hypotheses, prefix, constraints,
                      no_repeat_ngram_size, repetition_penalty):
        return self._search_nbest(source_ids, beam_size, alpha, num_hypotheses, prefix,
                                  constraints, (no_repeat_ngram_size, repetition_penalty))

    def _search_nbest(self, source_ids, beam_size, alpha, num_hypotheses, prefix=None,
                      constraints=None, repetition=None):
        if self._parts.batched is None:
            return super().nbest_ids(source_ids, beam_size, alpha, num_hypotheses, prefix,
                                     constraints, repetition)
        return self._parts.batched(source_ids, beam_size, alpha, num_hypotheses, prefix,
                                   constraints, repetition)

    @property
    def languages(self):
        """The targets of the `target_language` input (() for a one-pair run's export)."""
        return self._parts.languages

    @property
    def starts_word(self):
        """The word-start table of the `alignments` outputs (None: exported without)."""
        return self._parts.starts_word

    def signatures(self):
        return {"serving_default": self.serve, "translate_nbest": self.translate_nbest,
                "sample": self.sample, "score": self.score, **super().signatures()}


def as_when_saving(options):
    """The save context `tf.saved_model.save` traces in (TensorFlow's own, internal: without
    it, or outside TensorFlow 2.x's layout, the functions are traced twice, nothing worse)."""
    try:
        from tensorflow.python.saved_model import save_context
    except ImportError:  # pragma: no cover - a TensorFlow without the module
        return contextlib.nullcontext()
    if options is None or save_context.in_save_context():
        return contextlib.nullcontext()
    return save_context.save_context(options)


def existing_versions(base_dir):
    """Numeric version directories under base_dir (what TensorFlow Serving loads)."""
    base_dir = pathlib.Path(base_dir)
    if not base_dir.is_dir():
        return []
    return sorted(int(p.name) for p in base_dir.iterdir() if p.is_dir() and p.name.isdigit())


def export_saved_model(model, tokenizer, base_dir, version=None, overwrite=False,
                       max_input_length=MAX_LENGTH, ids_only=False,
                       beam_size=DEFAULTS["beam_size"], alpha=DEFAULTS["alpha"],
                       max_rows=MAX_ROWS, alignments=False, batching=Batching(), languages=(),
                       warmup=True):
    """Writes a SavedModel to base_dir/<version>/ atomically; returns its path.

    Args:
        version: integer version directory; default one more than the highest existing (1).
        overwrite: replace an existing version (otherwise an error).
        beam_size, alpha: the default `beam_size` and `alpha` inputs of the signatures;
            beam_size is also the beam of the `translate_ids_xla` signature (fixed when
            compiled).
        max_rows: the most rows one request may search (see `export.graph.MAX_ROWS`).
        alignments: the `alignments` output of serving_default and translate_nbest (not
            with ids_only).
        batching: a `Batching` (`export.batching`; the default's settings), or None: the
            text signatures search each request alone. Its settings are also written, as the
            text proto TensorFlow Serving's `--batching_parameters_file` reads, to
            assets.extra/batching_parameters.txt (`Batching.parameters_text`).
        languages: a run of several target languages: its targets, the first the default of
            the text signatures' `target_language` input.
        warmup: write TensorFlow Serving's warm-up records, one request per signature
            (assets.extra/tf_serving_warmup_requests, `export.warmup`), which it replays when
            it loads the version, so that no client pays a signature's first run.
    """
    base_dir = pathlib.Path(base_dir)
    base_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(base_dir)
    versions = existing_versions(base_dir)
    if version is None:
        version = (versions[-1] + 1) if versions else 1
    if version < 0:
        raise ExportError(f"version={version} must be a non-negative integer.")
    target = base_dir / str(version)
    if target.exists() and not overwrite:
        raise ExportError(
            f"{target} already exists: TensorFlow Serving may be serving it. Choose another "
            "version, or allow overwriting it.")
    module = (IdsTranslatorModule(model, max_input_length, beam_size, alpha, max_rows)
              if ids_only else
              TranslatorModule(model, tokenizer, max_input_length, beam_size, alpha, max_rows,
                               alignments, batching, languages))
    start = time.time()
    with atomic_path(target) as temporary:
        temporary.mkdir()  # from here on, everything goes under the temporary name
        options = tf.saved_model.SaveOptions()
        module.track_variables(options)
        tf.saved_model.save(module, str(temporary), signatures=module.signatures(),
                            options=options)
        if not ids_only:
            # The sentencepiece model, for clients that tokenize themselves (translate_ids).
            write_bytes(temporary / "assets.extra" / tokenizer.FILENAME, tokenizer.model_proto)
        # For a server's own batching (docs/export.md): in assets.extra, which TensorFlow
        # Serving never reads by itself (a `batching_params.pbtxt` in the version folder
        # would switch its per-model batching on, which these signatures' scalar options
        # cannot take); the same values as the graph's batcher, or its defaults.
        write_bytes(temporary / "assets.extra" / batching_module.FILENAME,
                    (batching or Batching()).parameters_text().encode("utf-8"))
        if warmup:
            write_warmup_requests(temporary, tokenizer)
    log.info("SavedModel written to %s in %.1f s", target, time.time() - start)
    return target


def signature_op_types(saved_model_dir, signature="translate_ids"):
    """Op types a signature of a SavedModel runs, including those inside nested functions
    (while-loop bodies, partitioned calls)."""
    graph = saved_meta_graph(saved_model_dir)
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
