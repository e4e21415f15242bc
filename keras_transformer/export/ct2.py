"""CTranslate2 export: our weights as a `ctranslate2.specs.TransformerSpec`, written to a
folder that the CTranslate2 engine (`decoding.engines.ctranslate2.CTranslate2Translator`) runs.

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
import pathlib
import time

import numpy as np

from keras_transformer.decoding.search.alignment import ALIGNMENT_HEADS, ALIGNMENT_LAYER
from keras_transformer.decoding.engines.ctranslate2 import METADATA, require_ctranslate2
from keras_transformer.decoding.request import DEFAULTS, PARSING
from keras_transformer.defaults import MAX_LENGTH
from keras_transformer.export.graph import ExportError
from keras_transformer.layers.embedding import sinusoidal_table
from keras_transformer.runs.run import atomic_path, remove_stale_temporaries, write_bytes
from pipelines.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

log = logging.getLogger(__name__)

QUANTIZATIONS = ("none", "int8", "int8_float32", "float16")
ACTIVATIONS = {"relu": "RELU", "gelu": "GELU"}


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
    return max_input_length + max(DEFAULTS["extra_length"], PARSING["extra_length"])


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
