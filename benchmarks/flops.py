"""Matmul FLOPs the Transformer must do, for MFU and achieved-GFLOP/s figures.

Counts matrix multiplications only: embedding look-ups, softmax, LayerNorm, top-k, cache
reordering and the optimizer are not counted. Imports nothing (no TensorFlow): `arch` is a
resolved architecture dict (`Transformer.architecture`, key_dim and value_dim filled in).
"""

import math


def train_step_flops(arch, vocab, batch, src_len, tgt_len):
    """Matmul FLOPs of one training step on (batch, src_len) sources and (batch, tgt_len)
    targets, forward and backward (3 x the forward).

    Forward: 2 x weights x tokens for the encoder's projections and feed-forward on source
    tokens, the decoder's on target tokens (the cross-attention keys and values on source
    tokens), the output projection on target tokens; plus the attention scores and weighted
    sums, 2 x heads x (d_k + d_v) per query-key pair (S x S, T x T and T x S per sentence and
    layer).
    """
    d_model, heads, layers = arch["d_model"], arch["num_heads"], arch["num_layers"]
    dk, dv, d_ff = arch["key_dim"], arch["value_dim"], arch["d_ff"]
    query_out = heads * (dk + dv) * d_model  # W_Q and W_O
    key_value = heads * (dk + dv) * d_model  # W_K and W_V
    ffn = 2 * d_model * d_ff
    src_tokens, tgt_tokens = batch * src_len, batch * tgt_len
    forward = 2 * layers * (query_out + key_value + ffn) * src_tokens  # encoder
    # Decoder: self-attention, cross-attention queries and output, FFN on target tokens; the
    # cross-attention keys and values on source tokens; then the output projection.
    forward += 2 * layers * (2 * query_out + key_value + ffn) * tgt_tokens
    forward += 2 * layers * key_value * src_tokens
    forward += 2 * vocab * d_model * tgt_tokens
    per_pair = 2 * heads * (dk + dv)  # Q K^T and weights x V, per (query, key) pair
    forward += layers * per_pair * batch * (src_len**2 + tgt_len**2 + tgt_len * src_len)
    return 3 * forward


def matmul_params(layer):
    """Number of weights in the Dense kernels of the Keras layer `layer` (each used once per
    token)."""
    return sum(int(math.prod(w.shape)) for w in layer.weights if w.path.endswith("kernel"))


def search_flops(model, batch, beam, src_len, out_len):
    """Matmul FLOPs a search of `model` (a built Transformer) must do: the encoder and the
    cross-attention keys and values once per source token, then for every one of batch x beam
    rows at each of out_len steps the decoder's projections, its attention over the steps so
    far and the source, and the output projection."""
    arch = model.architecture
    layers, d_model = arch["num_layers"], arch["d_model"]
    heads, dk, dv = arch["num_heads"], arch["key_dim"], arch["value_dim"]
    vocab = model.target_vocab_size or model.vocab_size
    cross_kv = layers * d_model * heads * (dk + dv)  # weights applied to the encoder output
    source_tokens, rows = batch * src_len, batch * beam
    flops = 2 * (matmul_params(model.encoder) + cross_kv) * source_tokens
    per_row = matmul_params(model.decoder) - cross_kv + vocab * d_model
    attention = layers * heads * (dk + dv) * (out_len * (out_len + 1) // 2 + out_len * src_len)
    return flops + 2 * rows * (per_row * out_len + attention)
