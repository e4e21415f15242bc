"""CTranslate2 export: our weights as a `ctranslate2.specs.TransformerSpec`, and a translator
that runs the exported model with the same input rules as the in-process `Translator`.

CTranslate2 (OpenNMT's C++ inference engine) serves Transformers with its own kernels: int8
weights through VNNI on CPUs that have it, fp16/bf16 on GPUs, batches re-sorted by length.
What the export has to spell out, because CTranslate2's defaults differ from ours:

- positions: ours are the paper's interleaved sines and cosines from position 0; CTranslate2's
  built-in table concatenates them and starts at position 1. The table is written explicitly,
  long enough for the longest input plus the parser's +300 output tokens (learned positions:
  the learned table);
- LayerNorm epsilon 1e-6 (the model's), not CTranslate2's default;
- post-norm (the paper) or pre-norm with its final LayerNorm;
- the sentencepiece vocabulary as piece strings; sources end with EOS (no BOS), decoding starts
  from BOS, as ours; PAD and BOS are never generated, as in our search.

Written to saved_models/<name>/ctranslate2[-<quantize>]/ (model.bin, config.json, the shared
vocabulary, and spm.model for tokenizing), atomically.

    keras-transformer export --run-dir runs/multi30k-en-de --format ctranslate2 --quantize int8
    keras-transformer translate --run-dir runs/multi30k-en-de --engine ctranslate2
"""

import json
import logging
import os
import pathlib
import time

import numpy as np

from keras_transformer.decoding.alignment import ALIGNMENT_HEADS, ALIGNMENT_LAYER
from keras_transformer.decoding.options import (
    check_prefixes, check_sampling, check_search_options, check_targets)
from keras_transformer.defaults import MAX_LENGTH, PARSING, TRANSLATION
from keras_transformer.errors import InputError
from keras_transformer.export.graph import ExportError
from keras_transformer.layers.embedding import sinusoidal_table
from keras_transformer.runs.run import atomic_path, remove_stale_temporaries, write_bytes
from pipelines.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from pipelines.vocabulary import FILENAME as VOCABULARY_FILE, normalize_whitespace

log = logging.getLogger(__name__)

QUANTIZATIONS = ("none", "int8", "int8_float32", "float16")
INSTALL_HINT = "pip install 'keras-transformer[ctranslate2]' (or pip install ctranslate2==4.8.5)"
ACTIVATIONS = {"relu": "RELU", "gelu": "GELU"}
METADATA = "keras_transformer.json"  # what we add to the folder: how to feed the model


def require_ctranslate2():
    """The ctranslate2 module, or a one-line InputError saying how to install it."""
    try:
        import ctranslate2
    except ImportError:
        raise InputError(f"The ctranslate2 package is not installed: {INSTALL_HINT}.") from None
    return ctranslate2


def ctranslate2_dirname(quantize):
    return "ctranslate2" if quantize == "none" else f"ctranslate2-{quantize}"


def check_architecture(model):
    """Raises ExportError naming what CTranslate2's TransformerSpec cannot express."""
    arch = model.architecture
    heads, d_model = arch["num_heads"], arch["d_model"]
    problems = []
    if arch["key_dim"] != arch["value_dim"]:
        problems.append(f"key_dim={arch['key_dim']} differs from value_dim={arch['value_dim']}")
    elif arch["key_dim"] * heads != d_model:
        problems.append(f"key_dim={arch['key_dim']} x num_heads={heads} != d_model={d_model}")
    if arch["activation"] not in ACTIVATIONS:
        problems.append(f"activation={arch['activation']!r} (supported: "
                        f"{', '.join(ACTIVATIONS)})")
    if model.target_vocab_size not in (None, model.vocab_size):
        problems.append(f"target_vocab_size={model.target_vocab_size} differs from the "
                        f"sentencepiece vocabulary shared by source and target "
                        f"({model.vocab_size})")
    if problems:
        raise ExportError("CTranslate2 cannot express this model: " + "; ".join(problems) + ".")


def _linear(spec, dense):
    spec.weight = np.ascontiguousarray(dense.kernel.numpy().T)  # CTranslate2: [out, in]
    if dense.use_bias:
        spec.bias = dense.bias.numpy()


def _fused(spec, denses):
    """Several of our projections as one CTranslate2 linear (rows stacked: [q; k; v])."""
    spec.weight = np.concatenate([d.kernel.numpy().T for d in denses], axis=0)
    if denses[0].use_bias:
        spec.bias = np.concatenate([d.bias.numpy() for d in denses], axis=0)


def _layer_norm(spec, layer):
    spec.gamma, spec.beta = layer.gamma.numpy(), layer.beta.numpy()


def _attention(spec, attention, residual, self_attention):
    if self_attention:  # linear[0]: Q, K and V fused; linear[1]: the output
        _fused(spec.linear[0], (attention.query_dense, attention.key_dense,
                                attention.value_dense))
    else:  # linear[0]: Q; linear[1]: K and V fused (of the encoder output); linear[2]: output
        _linear(spec.linear[0], attention.query_dense)
        _fused(spec.linear[1], (attention.key_dense, attention.value_dense))
    _linear(spec.linear[-1], attention.output_dense)
    _layer_norm(spec.layer_norm, residual.layer_norm)


def _feed_forward(spec, feed_forward, residual):
    _linear(spec.linear_0, feed_forward.inner)
    _linear(spec.linear_1, feed_forward.outer)
    _layer_norm(spec.layer_norm, residual.layer_norm)


def _positions(stack, rows, d_model):
    if stack.positional == "learned":
        return stack.positional_encoding.position_embeddings.numpy()
    return np.asarray(sinusoidal_table(np.arange(rows), d_model), np.float32)


def position_rows(max_input_length):
    """Positions the table must cover: the longest input plus the longest output it allows
    (translation: input + 50; parsing: input + 300)."""
    return max_input_length + max(TRANSLATION.extra_length, PARSING.extra_length)


def build_spec(model, pieces, max_input_length=MAX_LENGTH):
    """A `ctranslate2.specs.TransformerSpec` holding `model`'s weights.

    Args:
        model: a built `Transformer`.
        pieces: the vocabulary as piece strings, in id order (the sentencepiece model's).
        max_input_length: longest input (tokens with EOS) the model will be given.
    """
    require_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    check_architecture(model)
    if len(pieces) != model.vocab_size:
        raise ExportError(f"the vocabulary has {len(pieces)} pieces but the model "
                          f"{model.vocab_size} embeddings.")
    arch = model.architecture
    pre_norm = arch["norm_first"]
    # return_attention gives the cross-attention that our word alignments use.
    spec = transformer_spec.TransformerSpec.from_config(
        arch["num_layers"], arch["num_heads"], pre_norm=pre_norm,
        activation=getattr(common_spec.Activation, ACTIVATIONS[arch["activation"]]),
        alignment_layer=ALIGNMENT_LAYER, alignment_heads=ALIGNMENT_HEADS or arch["num_heads"])
    rows = position_rows(max_input_length)
    if arch["positional"] == "learned" and arch["max_length"] < rows:
        log.warning("learned positions cover %d tokens; CTranslate2 outputs are limited to "
                    "that length", arch["max_length"])
    encoder, decoder = spec.encoder, spec.decoder
    source_table = model.source_embedding.embeddings.numpy()
    target_table = model.target_embedding.embeddings.numpy()
    encoder.embeddings[0].weight = source_table
    decoder.embeddings.weight = target_table
    encoder.scale_embeddings = decoder.scale_embeddings = model.source_embedding.scale
    encoder.position_encodings.encodings = _positions(model.encoder, rows, arch["d_model"])
    decoder.position_encodings.encodings = _positions(model.decoder, rows, arch["d_model"])
    for layer_spec, layer in zip(encoder.layer, model.encoder.stack):
        _attention(layer_spec.self_attention, layer.self_attention,
                   layer.self_attention_residual, self_attention=True)
        _feed_forward(layer_spec.ffn, layer.feed_forward, layer.feed_forward_residual)
    for layer_spec, layer in zip(decoder.layer, model.decoder.stack):
        _attention(layer_spec.self_attention, layer.self_attention,
                   layer.self_attention_residual, self_attention=True)
        _attention(layer_spec.attention, layer.cross_attention,
                   layer.cross_attention_residual, self_attention=False)
        _feed_forward(layer_spec.ffn, layer.feed_forward, layer.feed_forward_residual)
    if pre_norm:
        _layer_norm(encoder.layer_norm, model.encoder.final_norm)
        _layer_norm(decoder.layer_norm, model.decoder.final_norm)
    if model.output_projection is not None:
        _linear(decoder.projection, model.output_projection)
    else:  # tied: logits = x E^T, i.e. a linear layer whose [out, in] weight is E itself
        decoder.projection.weight = target_table

    spec.register_source_vocabulary(list(pieces))
    spec.register_target_vocabulary(list(pieces))
    config = spec.config
    config.unk_token, config.bos_token = pieces[UNK_ID], pieces[BOS_ID]
    config.eos_token, config.decoder_start_token = pieces[EOS_ID], pieces[BOS_ID]
    config.add_source_bos, config.add_source_eos = False, True
    config.layer_norm_epsilon = float(arch["layer_norm_epsilon"])
    spec.validate()
    return spec


def export_ctranslate2(model, tokenizer, output_dir, quantize="none",
                       max_input_length=MAX_LENGTH, overwrite=False):
    """Writes the CTranslate2 model folder `output_dir` atomically; returns its path.

    quantize: "none" (float32), "int8", "int8_float32" or "float16" weights.
    """
    import sentencepiece as spm

    if quantize not in QUANTIZATIONS:
        raise ExportError(f"quantize={quantize!r} must be one of {', '.join(QUANTIZATIONS)}.")
    output_dir = pathlib.Path(output_dir)
    remove_stale_temporaries(output_dir.parent)
    if output_dir.exists() and not overwrite:
        raise ExportError(f"{output_dir} already exists; allow overwriting to replace it.")
    processor = spm.SentencePieceProcessor(model_proto=tokenizer.model_proto)
    pieces = [processor.id_to_piece(i) for i in range(processor.get_piece_size())]
    start = time.time()
    spec = build_spec(model, pieces, max_input_length)
    spec.optimize(quantization=None if quantize == "none" else quantize)
    with atomic_path(output_dir) as temporary:
        temporary.mkdir()
        spec.save(str(temporary))
        write_bytes(temporary / tokenizer.FILENAME, tokenizer.model_proto)
        write_bytes(temporary / METADATA, json.dumps({
            "max_input_length": max_input_length, "quantization": quantize,
            "suppressed": [pieces[PAD_ID], pieces[BOS_ID]],
        }, indent=2).encode("utf-8"))
    log.info("CTranslate2 model written to %s in %.1f s", output_dir, time.time() - start)
    return output_dir


class CTranslate2Translator:
    """Translates with an exported CTranslate2 folder, with the rules of our `Translator`.

    Whitespace is normalized, empty lines give empty outputs, inputs longer than the export's
    max_input_length are truncated (EOS kept), and each sentence may produce up to its input
    length + extra_length tokens with EOS (sentences of equal limit are decoded together,
    so that each gets exactly its own limit). `translate`, `sample` and `score` take and return
    what `Translator`'s do; the differences of CTranslate2's own search are in docs/export.md.

    Args:
        model_dir: the folder `export_ctranslate2` wrote.
        beam_size, batch_size, extra_length: as for `Translator`.
        alpha: CTranslate2's length penalty, score / length^alpha (not GNMT's
            ((5 + length) / 6)^alpha: the two rank beams a little differently).
        device: "cpu" or "cuda".
        compute_type: CTranslate2's ("default": the saved weights' type where the device
            supports it).
        threads: intra-op threads (default: every core of this machine).
    """

    def __init__(self, model_dir, beam_size=TRANSLATION.beam_size, alpha=TRANSLATION.alpha,
                 batch_size=TRANSLATION.batch_size, extra_length=TRANSLATION.extra_length,
                 device="cpu", compute_type="default", threads=None):
        self.ctranslate2 = require_ctranslate2()
        import sentencepiece as spm

        check_search_options(beam_size, batch_size, alpha)
        self.model_dir = pathlib.Path(model_dir)
        metadata_path = self.model_dir / METADATA
        if not metadata_path.is_file():
            raise InputError(f"{self.model_dir} is not a CTranslate2 export of keras-transformer "
                             f"({METADATA} is missing): run keras-transformer export --format "
                             "ctranslate2.")
        metadata = json.loads(metadata_path.read_text(encoding="utf-8"))
        self.max_input_length = metadata["max_input_length"]
        self.suppressed = [[piece] for piece in metadata["suppressed"]]
        self.beam_size, self.alpha = beam_size, alpha
        self.batch_size, self.extra_length = batch_size, extra_length
        self.processor = spm.SentencePieceProcessor(
            model_file=str(self.model_dir / VOCABULARY_FILE))
        self._engine_options = dict(device=device, compute_type=compute_type,
                                    intra_threads=threads or os.cpu_count() or 0)
        self.translator = self._engine()

    def _engine(self):
        return self.ctranslate2.Translator(str(self.model_dir), **self._engine_options)

    def encode(self, sentences):
        """Strings -> piece lists without EOS (CTranslate2 adds it), truncated so that with
        EOS they fit max_input_length."""
        pieces = self.processor.encode(list(sentences), out_type=str)
        return [p[: self.max_input_length - 1] for p in pieces]

    def encode_targets(self, sentences):
        """Strings -> piece lists without EOS, whitespace normalized, not truncated."""
        return self.processor.encode(
            [normalize_whitespace(s.rstrip("\n")) if s else "" for s in sentences], out_type=str)

    def _options(self, max_decoding_length):
        # Our limit, the input with its EOS + extra_length, counts the output's EOS: at most
        # length + extra_length tokens before it, which is CTranslate2's bound on the tokens
        # it returns for this max_decoding_length (a target prefix counts in it).
        return dict(beam_size=self.beam_size, length_penalty=self.alpha,
                    max_decoding_length=max_decoding_length,
                    max_input_length=0, suppress_sequences=self.suppressed,
                    return_scores=True)

    def translate_pieces(self, pieces, nbest=1, progress=None, prefixes=None, translator=None,
                         **options):
        """Piece lists [and target prefixes: piece lists, [] for none] -> lists of
        (pieces, score) per sentence, best first. `options`: more translate_batch options."""
        results = [None] * len(pieces)
        by_limit = {}  # our limit: max(input + extra_length, prefix) tokens before EOS
        for i, p in enumerate(pieces):
            limit = max(len(p) + self.extra_length, len(prefixes[i]) if prefixes else 0)
            by_limit.setdefault(limit, []).append(i)
        for limit, rows in sorted(by_limit.items()):
            for start in range(0, len(rows), self.batch_size):
                chunk = rows[start: start + self.batch_size]
                prefix = None if prefixes is None else [prefixes[i] or None for i in chunk]
                outputs = (translator or self.translator).translate_batch(
                    [pieces[i] for i in chunk], target_prefix=prefix, num_hypotheses=nbest,
                    **{**self._options(limit), **options})
                for i, output in zip(chunk, outputs):
                    results[i] = list(zip(output.hypotheses, output.scores))
                if progress is not None:
                    progress.update(len(chunk))
        return results

    def translate(self, sentences, nbest=False, progress=None, prefixes=None):
        """As `Translator.translate`: strings (or, with nbest, (translation, score) lists);
        prefixes (one string per sentence, "" for none) become CTranslate2's target_prefix."""
        _, found = self._decode(sentences, prefixes, self.beam_size if nbest else 1, progress)
        results = [[("", 0.0)] if hypotheses is None else
                   [(self.processor.decode(p), float(s)) for p, s in hypotheses]
                   for hypotheses in found]
        return results if nbest else [r[0][0] for r in results]

    def sample(self, sentences, num_samples=1, top_k=0, top_p=1.0, temperature=1.0, seed=0,
               prefixes=None, progress=None):
        """As `Translator.sample`: num_samples (translation, log P(translation | sentence))
        pairs per sentence, drawn by CTranslate2 (sampling_topk, sampling_topp,
        sampling_temperature) with its random generator seeded with `seed` (the same seed
        gives the same samples here; not ours). The scores are score_batch's, EOS included,
        as ours."""
        check_sampling(num_samples, top_k, top_p, temperature, seed)
        # CTranslate2 seeds a worker thread's generator when the thread starts: a fresh
        # translator after set_random_seed (cheap: the weights are mapped again).
        self.ctranslate2.set_random_seed(seed)
        sampler = self._engine()
        # top_k=1 draws the most likely token: CTranslate2 then returns one hypothesis.
        sources, found = self._decode(
            sentences, prefixes, 1 if top_k == 1 else num_samples, progress, translator=sampler,
            beam_size=1, sampling_topk=top_k, sampling_topp=top_p,
            sampling_temperature=temperature)
        found = [h if h is None or top_k != 1 else h * num_samples for h in found]
        pairs = [(i, p) for i, hypotheses in enumerate(found) if hypotheses is not None
                 for p, _ in hypotheses]
        scores = iter(self.score_pieces([sources[i] for i, _ in pairs], [p for _, p in pairs]))
        return [[("", 0.0)] if hypotheses is None else
                [(self.processor.decode(p), float(sum(next(scores)))) for p, _ in hypotheses]
                for hypotheses in found]

    def _decode(self, sentences, prefixes, nbest, progress, translator=None, **options):
        """(source pieces, per sentence: [(pieces, score)] best first, or None for an empty
        input)."""
        sentences = [normalize_whitespace(s.rstrip("\n")) for s in sentences]
        prefix_pieces = self._prefix_pieces(sentences, prefixes)
        todo = [i for i, s in enumerate(sentences) if s]
        encoded = dict(zip(todo, self.encode([sentences[i] for i in todo])))
        sources = [encoded.get(i) for i in range(len(sentences))]
        found = self.translate_pieces(
            [sources[i] for i in todo], nbest=nbest, progress=progress,
            prefixes=None if prefix_pieces is None else [prefix_pieces[i] for i in todo],
            translator=translator, **options)
        results = dict(zip(todo, found))
        results = [results.get(i) for i in range(len(sentences))]
        if progress is not None:
            progress.update(len(sentences) - len(todo))
        return sources, results

    def _prefix_pieces(self, sentences, prefixes):
        check_prefixes(sentences, prefixes)
        if prefixes is None:
            return None
        pieces = self.encode_targets([p or "" for p in prefixes])
        return pieces if any(pieces) else None

    def score(self, sources, targets, progress=None):
        """As `Translator.score`: [{"log_prob", "tokens", "mean"}] per pair, from CTranslate2's
        score_batch (natural-log probabilities of the target's tokens and its EOS)."""
        check_targets(sources, targets)
        sources = self.encode([normalize_whitespace(s.rstrip("\n")) for s in sources])
        results = []
        for per_token in self.score_pieces(sources, self.encode_targets(targets)):
            total = float(sum(per_token))
            results.append({"log_prob": total, "tokens": len(per_token),
                            "mean": total / len(per_token)})
        if progress is not None:
            progress.update(len(results))
        return results

    def score_pieces(self, sources, targets):
        """Forced decoding: per-token log-probabilities of each target (EOS last)."""
        outputs = self.translator.score_batch(sources, targets, max_input_length=0,
                                              max_batch_size=self.batch_size) if sources else []
        return [list(output.log_probs) for output in outputs]
