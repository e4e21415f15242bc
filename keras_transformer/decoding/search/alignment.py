"""Word alignments from the encoder-decoder attention, in Pharaoh format, and their error rate.

A word alignment says which source word each target word translates: users carry markup,
terminology and formatting from a sentence to its translation with it. OpenNMT-tf, Marian,
fairseq and CTranslate2 all take it from the cross-attention of a decoder layer; so does this
module:

1. the cross-attention of a target (a hypothesis or a given translation) is computed in one
   teacher-forced decoder pass (`cross_attention`): row t is the attention of the step that
   produces target token t, from one decoder layer, averaged over its heads (an `Ensemble`
   averages its members' too). Which layer and heads: `ALIGNMENT_LAYER`, `ALIGNMENT_HEADS`,
   measured in docs/decoding.md ("Word alignments");
2. subword pieces are gathered into words (`word_links`): a word is a space-separated token of
   the text, and with the sentencepiece vocabulary a piece that starts with "\u2581" starts a
   word, so word indices are cumsum(starts_word[ids]) - 1, in a graph too, with the constant
   table `starts_word_table(pieces)`. PAD, BOS and EOS belong to no word, on either side;
3. the attention a target word's pieces give each source word's pieces is summed into a
   (target words, source words) matrix, and each target word is linked to the source word it
   attends to most (ties: the first). Every target word gets exactly one link, every source
   word any number;
4. the links are written in Pharaoh format, "s-t s-t ..." (source word index - target word
   index, from 0, in target order), by Python (`pharaoh`, `pharaoh_lines`) or inside a
   TensorFlow graph (`pharaoh_graph`, for the SavedModel): the two give the same strings.

CTranslate2 returns the same attention (`return_attention=True`) from the layer and heads its
spec names (`export.ct2.build_spec` sets ours); `ctranslate2_pharaoh` applies the same rule to
it. `alignment_error_rate` (Och and Ney, 2003) measures links against gold sure/possible
links read with `read_pharaoh`.

    starts_word = starts_word_table(vocabulary.pieces())
    align_texts(model, vocabulary, ["3 1 4"], ["drei eins vier"])   # -> ["0-0 1-1 2-2"]

References:
    Och and Ney, 2003. A Systematic Comparison of Various Statistical Alignment Models.
    Garg et al., 2019. Jointly Learning to Align and Translate with Transformer Models.
"""

import pathlib

import numpy as np
from keras import ops

from keras_transformer.errors import InputError
from pipelines.special_ids import BOS_ID, EOS_ID, PAD_ID

# The decoder layer whose cross-attention aligns: the last (negative indices count from it).
# Measured on the digit corpus of the tests (docs/decoding.md, "Word alignments").
ALIGNMENT_LAYER = -1
# Heads averaged: None for all of the layer's heads, N for its first N heads (CTranslate2's
# `alignment_heads` means the same).
ALIGNMENT_HEADS = None
WORD_START = "\u2581"  # sentencepiece's word-boundary mark: a piece beginning with it starts a word
SPECIAL_IDS = (PAD_ID, BOS_ID, EOS_ID)


def starts_word_table(pieces):
    """The constant (V,) boolean table `starts_word[id]`: True where the piece starts a word
    ("\u2581" first), False for PAD, BOS and EOS.

    Args:
        pieces: the vocabulary's pieces in id order (`Vocabulary.pieces()`).
    """
    table = np.array([str(piece).startswith(WORD_START) for piece in pieces], bool)
    table[[i for i in SPECIAL_IDS if i < len(table)]] = False
    return table


def layer_index(layer, num_layers):
    """`layer` (negative: from the last) as an index in 0..num_layers - 1; InputError if
    the model has no such layer."""
    index = layer + num_layers if layer < 0 else layer
    if not 0 <= index < num_layers:
        raise InputError(f"alignment layer={layer} is out of range for a decoder of "
                         f"{num_layers} layers (use 0..{num_layers - 1}, or -1 for the last).")
    return index


def cross_attention(model, source_ids, target_ids, layer=ALIGNMENT_LAYER,
                    heads=ALIGNMENT_HEADS):
    """The cross-attention of given targets, teacher-forced: one decoder pass.

    Args:
        model: a `Transformer`, or an `Ensemble` (`.members`: their attention is averaged).
        source_ids: (B, S) int32, EOS-terminated, 0-padded (as the search takes them).
        target_ids: (B, T) int32, the outputs: EOS-terminated, 0-padded, no BOS (as the
            search returns them, or a given translation with EOS appended).
        layer: the decoder layer (from 0; negative from the last).
        heads: None to average all heads, N to average the first N.

    Returns:
        (B, T, S) float32: row t is the attention, over source positions, of the decoder step
        that produces target_ids[:, t] (its input is the token before it, BOS first).
    """
    members = getattr(model, "members", None)
    if members is not None:
        weights = [cross_attention(member, source_ids, target_ids, layer, heads)
                   for member in members]
        return weights[0] if len(weights) == 1 else ops.mean(ops.stack(weights), axis=0)
    target_ids = ops.cast(target_ids, "int32")
    batch = ops.shape(target_ids)[0]
    inputs = ops.concatenate([ops.full((batch, 1), BOS_ID, "int32"), target_ids[:, :-1]],
                             axis=1)
    # A padded row's decoder input ends where it does: PAD after EOS stays PAD.
    inputs = ops.where(ops.equal(target_ids, PAD_ID), PAD_ID, inputs)
    encoder_output, source_mask = model.encode(source_ids)
    _, weights = model.decode(inputs, encoder_output, source_mask,
                              return_attention_scores=True)
    chosen = weights[layer_index(layer, len(weights))][1]  # (B, H, T, S): (self, cross)[1]
    num_heads = ops.shape(chosen)[1]
    if heads is not None:
        if not 1 <= heads <= num_heads:
            raise InputError(f"alignment heads={heads} must be 1..{num_heads} (the layer's "
                             "heads), or None for all.")
        chosen = chosen[:, :heads]
    return ops.mean(ops.cast(chosen, "float32"), axis=1)


def word_index(ids, starts_word):
    """Which word each piece belongs to.

    Args:
        ids: (B, L) int32 pieces (PAD, BOS and EOS belong to no word).
        starts_word: the (V,) boolean table of `starts_word_table`.

    Returns:
        (word index (B, L) int32, -1 for PAD/BOS/EOS; words (B,) int32). A row's first piece
        starts a word even without "\u2581" (as the text's first word).
    """
    ids = ops.cast(ids, "int32")
    real = ops.logical_not(ops.logical_or(
        ops.logical_or(ops.equal(ids, PAD_ID), ops.equal(ids, BOS_ID)),
        ops.equal(ids, EOS_ID)))
    first = ops.logical_and(real, ops.equal(ops.cumsum(ops.cast(real, "int32"), axis=1), 1))
    starts = ops.logical_and(real, ops.logical_or(ops.take(starts_word, ids), first))
    counts = ops.cumsum(ops.cast(starts, "int32"), axis=1)
    return ops.where(real, counts - 1, -1), counts[:, -1]


def word_links(attention, source_ids, target_ids, starts_word):
    """Subword attention gathered into word links: each target word's best source word.

    Args:
        attention: (B, T, S) from `cross_attention` (rows: target pieces, columns: source).
        source_ids: (B, S) and target_ids: (B, T) int32, as given to `cross_attention`.
        starts_word: the (V,) boolean table of `starts_word_table`.

    Returns:
        {"links": (B, T) int32, the source word linked to target word j at [:, j] (-1 for
        j >= target_words), "target_words": (B,) int32, "source_words": (B,) int32}.

    A target word's score for a source word is the attention its pieces give that word's
    pieces, summed (EOS and padding columns dropped); its link is the best one (ties: the
    first). Written in keras.ops: it runs eagerly, in a TensorFlow graph and under JAX.
    """
    source_word, source_words = word_index(source_ids, starts_word)  # (B, S), (B,)
    target_word, target_words = word_index(target_ids, starts_word)  # (B, T), (B,)
    source_range = ops.arange(ops.shape(source_ids)[1], dtype="int32")
    target_range = ops.arange(ops.shape(target_ids)[1], dtype="int32")
    # Piece-to-word membership, one-hot: (B, S, Ws) and (B, T, Wt), with Ws = S and Wt = T
    # (at most one word per piece); PAD/BOS/EOS (index -1) are in no column.
    source_onehot = ops.cast(ops.equal(source_word[:, :, None], source_range), "float32")
    target_onehot = ops.cast(ops.equal(target_word[:, :, None], target_range), "float32")
    scores = ops.matmul(ops.matmul(ops.transpose(target_onehot, (0, 2, 1)),
                                   ops.cast(attention, "float32")), source_onehot)  # (B, Wt, Ws)
    # Scores are >= 0: a column that is no source word gets -1 and is never chosen.
    is_word = ops.less(source_range[None, :], source_words[:, None])  # (B, Ws)
    scores = ops.where(is_word[:, None, :], scores, -1.0)
    links = ops.cast(ops.argmax(scores, axis=-1), "int32")  # (B, Wt)
    linked = ops.logical_and(ops.less(target_range[None, :], target_words[:, None]),
                             ops.greater(source_words, 0)[:, None])
    return {"links": ops.where(linked, links, -1), "target_words": target_words,
            "source_words": source_words}


def align_ids(model, source_ids, target_ids, starts_word, layer=ALIGNMENT_LAYER,
              heads=ALIGNMENT_HEADS):
    """`cross_attention` then `word_links`: the word links of given targets (a graph or
    eager function; the SavedModel and a compiled engine call it as it is)."""
    attention = cross_attention(model, source_ids, target_ids, layer, heads)
    return word_links(attention, source_ids, target_ids, starts_word)


# -- Pharaoh format ---------------------------------------------------------------------------

def pharaoh(links):
    """One row of links (source word per target word, -1 from the first unlinked on) ->
    "s-t s-t ..." ("" for none)."""
    pairs = []
    for target, source in enumerate(np.asarray(links).tolist()):
        if source < 0:
            break
        pairs.append(f"{source}-{target}")
    return " ".join(pairs)


def pharaoh_lines(result):
    """`word_links`/`align_ids`' output (tensors or numpy) -> one Pharaoh string per row."""
    return [pharaoh(row) for row in ops.convert_to_numpy(result["links"])]


def pharaoh_graph(result):
    """The same strings as `pharaoh_lines`, as a (B,) tf.string tensor computed in the graph
    (usable inside a tf.function: the SavedModel's `alignments` output). TensorFlow only."""
    import tensorflow as tf

    links = tf.convert_to_tensor(result["links"], tf.int32)  # (B, T)
    targets = tf.broadcast_to(tf.range(tf.shape(links)[1])[None, :], tf.shape(links))
    pairs = tf.strings.join([tf.strings.as_string(links), tf.strings.as_string(targets)],
                            separator="-")
    lengths = tf.reduce_sum(tf.cast(links >= 0, tf.int32), axis=1)
    return tf.strings.reduce_join(tf.RaggedTensor.from_tensor(pairs, lengths=lengths),
                                  axis=1, separator=" ")


def format_pharaoh(links):
    """A set of (source, target) pairs -> "s-t ..." sorted by target then source."""
    return " ".join(f"{s}-{t}" for s, t in sorted(links, key=lambda pair: (pair[1], pair[0])))


def parse_pharaoh(line, where="the alignment"):
    """One Pharaoh line -> (sure, possible): sets of (source, target) pairs.

    "s-t" is a sure link; "s?t" (or "spt") a possible one, as gold alignments mark them;
    possible includes sure. An empty line has no links. `where` names the line in errors.
    """
    sure, possible = set(), set()
    for token in line.split():
        for mark, into in (("-", (sure, possible)), ("?", (possible,)), ("p", (possible,))):
            left, found, right = token.partition(mark)
            if found:
                break
        if not (found and left.isdigit() and right.isdigit()):
            raise InputError(f"{where}: {token!r} is not a Pharaoh link: write source-target "
                             "word indices from 0 as 's-t' (sure) or 's?t' (possible).")
        for links in into:
            links.add((int(left), int(right)))
    return sure, possible


def read_pharaoh(path_or_lines):
    """Gold (or predicted) alignments, one sentence per line: a file path or an iterable of
    lines -> list of (sure, possible) sets per line."""
    if isinstance(path_or_lines, (str, pathlib.Path)):
        path = pathlib.Path(path_or_lines)
        if not path.is_file():
            raise InputError(f"alignment file not found: {path}")
        lines, name = path.read_text(encoding="utf-8").splitlines(), str(path)
    else:
        lines, name = list(path_or_lines), "alignment input"
    return [parse_pharaoh(line, f"{name}, line {number}")
            for number, line in enumerate(lines, start=1)]


def alignment_error_rate(predicted, gold):
    """AER = 1 - (|A & S| + |A & P|) / (|A| + |S|), summed over the corpus (Och and Ney,
    2003): 0 is perfect.

    Args:
        predicted: per sentence, a Pharaoh string or a set of (source, target) links (A).
        gold: per sentence, a Pharaoh string or (sure S, possible P) sets (P includes S).
    """
    predicted, gold = list(predicted), list(gold)
    if len(predicted) != len(gold):
        raise InputError(f"{len(predicted)} predicted alignments for {len(gold)} gold ones: "
                         "give one per sentence to both.")
    hits_sure = hits_possible = size_predicted = size_sure = 0
    for number, (links, reference) in enumerate(zip(predicted, gold), start=1):
        if isinstance(links, str):
            links = parse_pharaoh(links, f"predicted alignment {number}")[1]
        sure, possible = (parse_pharaoh(reference, f"gold alignment {number}")
                          if isinstance(reference, str) else reference)
        links, possible = set(links), set(possible) | set(sure)
        hits_sure += len(links & set(sure))
        hits_possible += len(links & possible)
        size_predicted += len(links)
        size_sure += len(sure)
    if size_predicted + size_sure == 0:
        return 0.0
    return 1.0 - (hits_sure + hits_possible) / (size_predicted + size_sure)


# -- Text and CTranslate2 ---------------------------------------------------------------------

def padded(rows):
    """Id lists -> (n, width) int32 0-padded (at least one column)."""
    array = np.zeros((len(rows), max([len(row) for row in rows] + [1])), np.int32)
    for number, row in enumerate(rows):
        array[number, : len(row)] = row
    return array


def align_texts(model, vocabulary, sources, targets, batch_size=32, layer=ALIGNMENT_LAYER,
                heads=ALIGNMENT_HEADS, max_input_length=None):
    """The word alignment of each (source, target) pair, teacher-forced: Pharaoh strings.

    Args:
        model: a `Transformer` or an `Ensemble`.
        vocabulary: the run's `Vocabulary`.
        sources, targets: strings, one target per source (empty lines give "").
        max_input_length: sources longer (in pieces, EOS included) are truncated (their last
            words then have no link).
    """
    if len(sources) != len(targets):
        raise InputError(f"{len(sources)} sources and {len(targets)} targets: give one "
                         "target per source.")
    starts_word = starts_word_table(vocabulary.pieces())
    source_rows = [ids + [EOS_ID] for ids in vocabulary.encode(sources)] if sources else []
    if max_input_length:
        source_rows = [row if len(row) <= max_input_length else
                       row[: max_input_length - 1] + [EOS_ID] for row in source_rows]
    target_rows = [ids + [EOS_ID] for ids in vocabulary.encode(targets)] if targets else []
    results = [""] * len(sources)
    order = sorted(range(len(sources)), key=lambda i: (len(source_rows[i]),
                                                        len(target_rows[i])))
    for start in range(0, len(order), batch_size):
        chunk = order[start: start + batch_size]
        found = align_ids(model, padded([source_rows[i] for i in chunk]),
                          padded([target_rows[i] for i in chunk]), starts_word, layer, heads)
        for i, line in zip(chunk, pharaoh_lines(found)):
            results[i] = line
    return results


def ctranslate2_pharaoh(source_pieces, target_pieces, attention):
    """CTranslate2's attention of one hypothesis -> the Pharaoh string of our rule.

    Args:
        source_pieces: the source's pieces as given to CTranslate2 (without EOS).
        target_pieces: the hypothesis' pieces (without EOS).
        attention: `translate_batch(..., return_attention=True)`'s `attention[k]` for that
            hypothesis: one row per target piece, one column per source piece (CTranslate2
            leaves out the EOS it appended; a column for it is ignored).
    """
    # One more row and column for the EOS of each side (in no word: never linked).
    rows = np.zeros((len(target_pieces) + 1, len(source_pieces) + 1), np.float32)
    for t, row in enumerate(list(attention)[: len(target_pieces)]):
        row = np.asarray(row, np.float32)[: len(source_pieces)]
        rows[t, : len(row)] = row
    # Pieces as ids of a private 5-entry table: 0-2 the special ids, 3 starts a word, 4 not.
    table = np.array([False, False, False, True, False])

    def ids(pieces):
        return [3 if piece.startswith(WORD_START) else 4 for piece in pieces]

    found = word_links(rows[None], np.array([ids(source_pieces) + [EOS_ID]], np.int32),
                       np.array([ids(target_pieces) + [EOS_ID]], np.int32), table)
    return pharaoh_lines(found)[0]
