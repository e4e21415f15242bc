"""Several language pairs in one run (Johnson et al., 2017): the target-language tags and the
mixing of the pairs' training data by a sampling temperature (Arivazhagan et al., 2019).

    tag("fr")                                   # "<2fr>", one reserved vocabulary piece
    tagged("A dog runs.", "fr")                 # "<2fr> A dog runs."
    pair_shares([29000, 1000], temperature=5)   # each pair's share of the mixed stream
    mixed_pairs([pairs_de, pairs_fr], [29000, 1000], temperature=5, seed=1234)

The tag is the source's first token (see docs/training.md, "Several target languages"): every
engine and export reads it as one more word of the source, and the target side (prefixes,
n-best lists, scores, alignments, constraints) is the same as in a one-pair run.

Mixing: pair i is drawn with probability p_i proportional to (n_i / N) ** (1 / T), where n_i
is its number of training pairs and N their total; T = 1 follows the corpus sizes, larger T
flattens them towards uniform (T = 5 in Arivazhagan et al. for unequal corpora). One pass of
the mixed stream (an epoch of the prepared data) holds every pair of every corpus at least once:
its length E is the least for which p_i * E >= n_i for all i, and pair i fills round(p_i * E)
places, its corpus read again from the start where it is upsampled. Which pair each place of
the stream comes from is a seeded shuffle, so the prepared data (and therefore the batch stream
and its resumable position) is the same for the same corpora, temperature and seed.

Nothing here knows the model, the training config or the datasets: `datasets.Mixing` reads
the pairs' corpora and mixes them with these functions.
"""

import math


from pipelines.errors import DataError

# Pair mixing temperature when a config sets none (Arivazhagan et al. 2019, unequal corpora).
TEMPERATURE = 5.0


def tag(language):
    """The source token that asks for `language`: "<2fr>"."""
    return f"<2{language}>"


def tagged(text, language):
    """`text` with the tag of `language` in front (the empty text stays empty: nothing to
    translate)."""
    return f"{tag(language)} {text}" if text else text


def untag_alignment(line):
    """A Pharaoh alignment of a tagged source with its tag (source word 0) taken out: the
    links of the tag are dropped, the other source indices moved down by one."""
    links = []
    for link in line.split():
        source, target = link.split("-")
        if int(source) > 0:
            links.append(f"{int(source) - 1}-{target}")
    return " ".join(links)


def pair_shares(sizes, temperature=TEMPERATURE):
    """Each pair's probability in the mixed stream: (n_i / N) ** (1 / T), normalized."""
    if temperature <= 0:
        raise DataError(f"pair_sampling_temperature must be above 0; got {temperature!r}.")
    import numpy as np

    sizes = np.asarray(sizes, np.float64)
    if sizes.size == 0 or np.any(sizes <= 0):
        raise DataError(f"every language pair needs training pairs; the sizes are "
                        f"{[int(s) for s in sizes]}.")
    weights = (sizes / sizes.sum()) ** (1.0 / temperature)
    return weights / weights.sum()


def pair_counts(sizes, temperature=TEMPERATURE):
    """How many places of one pass of the mixed stream each pair fills (>= its size)."""
    shares = pair_shares(sizes, temperature)
    length = max(size / share for size, share in zip(sizes, shares))
    return [max(int(size), int(math.ceil(share * length - 1e-9)))
            for size, share in zip(sizes, shares)]


def pair_order(counts, seed):
    """The pair index of each place of one pass: `counts[i]` places of pair i, shuffled with
    `seed` (int64, as tf.data's `choose_from_datasets` takes it: 8 bytes a training pair, held
    while the corpus is prepared)."""
    import numpy as np

    order = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    np.random.default_rng(seed).shuffle(order)
    return order


def mixed_pairs(datasets, sizes, temperature=TEMPERATURE, seed=0):
    """One pass of the mixed stream of several pairs' datasets (tf.data datasets of
    (source, target) strings, each already tagged): pair i read `pair_counts(...)[i]` times in
    a seeded order, its corpus repeated where it is upsampled."""
    import tensorflow as tf

    counts = pair_counts(sizes, temperature)
    choices = tf.data.Dataset.from_tensor_slices(pair_order(counts, seed))
    return tf.data.Dataset.choose_from_datasets([d.repeat() for d in datasets], choices)
