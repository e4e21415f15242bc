"""Attention pictures like the paper's Figures 3-5: heat maps of one head's weights."""

import pathlib

import numpy as np
import tensorflow as tf

from keras_transformer.errors import InputError
from keras_transformer.runs.run import atomic_path
from pipelines.special_ids import BOS_ID

KINDS = ("encoder", "decoder", "cross")


def attention_weights(model, tokenizer, source_ids, target_ids):
    """Weights of every layer for one sentence pair.

    Args:
        source_ids: (1, S) with EOS; target_ids: (1, T) output ids ending with EOS.

    Returns:
        {"encoder": [L x (H, S, S)], "decoder": [L x (H, T, T)], "cross": [L x (H, T, S)]},
        plus "source_pieces" and "target_pieces" (labels), target = [BOS] + output[:-1].
    """
    decoder_in = tf.concat([[[BOS_ID]], target_ids[:, :-1]], axis=1)
    encoder_output, source_mask, encoder_weights = model.encode(
        source_ids, return_attention_scores=True)
    _, decoder_weights = model.decode(decoder_in, encoder_output, source_mask,
                                      return_attention_scores=True)

    def pieces(ids):
        return [p.decode("utf-8") for p in tokenizer.id_to_piece(tf.reshape(ids, [-1])).numpy()]

    return {
        "encoder": [w[0].numpy() for w in encoder_weights],
        "decoder": [w[0][0].numpy() for w in decoder_weights],
        "cross": [w[1][0].numpy() for w in decoder_weights],
        "source_pieces": pieces(source_ids),
        "query_pieces": pieces(decoder_in),
        "target_pieces": pieces(target_ids),
    }


def plot(weights, kind, layer, head, path, title=None):
    """Writes a PNG heat map of `kind` attention (encoder/decoder/cross) at layer/head."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if kind not in KINDS:
        raise InputError(f"kind={kind!r} must be one of {KINDS}.")
    layers = weights[kind]
    if not 0 <= layer < len(layers):
        raise InputError(f"layer={layer} is out of range: the model has {len(layers)} layers "
                         f"(0..{len(layers) - 1}).")
    heads = layers[layer].shape[0]
    if not 0 <= head < heads:
        raise InputError(f"head={head} is out of range: the model has {heads} heads.")
    matrix = layers[layer][head]
    rows, cols = {"encoder": ("source_pieces", "source_pieces"),
                  "decoder": ("query_pieces", "query_pieces"),
                  "cross": ("query_pieces", "source_pieces")}[kind]
    rows, cols = weights[rows], weights[cols]
    size = max(4.0, 0.35 * max(len(rows), len(cols)) + 2)
    figure, axes = plt.subplots(figsize=(size, size))
    image = axes.imshow(matrix, cmap="viridis", vmin=0.0, vmax=max(float(np.max(matrix)), 1e-6))
    axes.set_xticks(range(len(cols)), cols, rotation=90, fontsize=8)
    axes.set_yticks(range(len(rows)), rows, fontsize=8)
    axes.set_xlabel("attended (keys)")
    axes.set_ylabel("attending (queries)")
    label = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
             "cross": "encoder-decoder attention"}[kind]
    axes.set_title(title or f"{label}, layer {layer + 1} of {len(layers)}, head {head + 1}",
                   fontsize=10)
    figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04)
    figure.tight_layout()
    path = pathlib.Path(path)
    with atomic_path(path) as temporary:
        figure.savefig(temporary, dpi=120)
    plt.close(figure)
    return path


def draw_sentence(translator, tokenizer, sentence, output_dir, kinds=KINDS, layer=None, head=1):
    """Translates `sentence` with `translator` (a `Translator`) and writes PNG heat maps of
    head `head` (from 1) at layer `layer` (from 1; None: the last) for each of `kinds`.
    `tokenizer`: the run's TensorFlow `SubwordTokenizer` (`Run.tokenizer()`), for the labels.

    Returns:
        (the translation, the paths written).
    """
    source_ids = tf.constant(translator.encode([sentence]), tf.int32)
    output = translator.search_ids(source_ids)["ids"][:, 0]
    weights = attention_weights(translator.model, tokenizer, source_ids, output)
    layer = len(weights["encoder"]) - 1 if layer is None else layer - 1
    folder = pathlib.Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    paths = [plot(weights, kind, layer, head - 1,
                  folder / f"attention-{kind}-layer{layer + 1}-head{head}.png")
             for kind in kinds]
    return translator.vocabulary.decode(output)[0], paths
