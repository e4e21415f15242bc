"""The dataset registry: a dataset name and a split -> (source, target) text pairs.

Functions of plain arguments (names, languages, folders); nothing here knows the model or the
training config.

    pairs, files = load_pairs("multi30k", "train", "en", "de")
    sources, references = split_texts("multi30k", "test", "en", "de")

Datasets:
- "multi30k": Multi30k task 1 (train / val / test2016) from local raw files
  (`sources.default_multi30k_dir()`: $MULTI30K_DIR, else ../shared/data/multi30k), else
  downloaded through its tfds builder;
- "wmt14": tensorflow-datasets' `wmt14_translate` (train / newstest2013 / newstest2014);
- "text": the user's own line-aligned files (`text_files`);
- "ptb": constituency parsing on the Penn Treebank sample (sentence -> linearized tree).
"""

import pathlib

import tensorflow as tf

from pipelines import sources, treebank
from pipelines.errors import DataError

DATASETS = ("multi30k", "wmt14", "text", "ptb")
SPLITS = ("train", "dev", "test")
_MULTI30K_SPLITS = {"train": "train", "dev": "val", "test": "test2016"}
_WMT14_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


def _check(dataset, split):
    if dataset not in DATASETS:
        raise DataError(f"Unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}.")
    if split not in SPLITS:
        raise DataError(f"Unknown split {split!r}; choose one of {', '.join(SPLITS)}.")


def load_pairs(dataset, split, src_lang="en", tgt_lang="de", *, data_dir=None, source_dir=None,
               text_files=None):
    """The text pairs of one split.

    Args:
        dataset: one of `DATASETS`.
        split: "train", "dev" or "test".
        src_lang, tgt_lang: the translation direction.
        data_dir: tensorflow-datasets' data directory (multi30k, wmt14).
        source_dir: the raw Multi30k files, or the folder of the PTB sample archive.
        text_files: dataset "text": {split: (source file, target file)}.

    Returns:
        (tf.data.Dataset of (source, target) strings, or None when a "text" dataset has no
        files for the split; the files the pairs come from, which key the vocabulary cache).
    """
    _check(dataset, split)
    if dataset == "multi30k":
        source_dir = source_dir or sources.default_multi30k_dir()
        files = ([pathlib.Path(source_dir) / f"train.{lang}.gz" for lang in (src_lang, tgt_lang)]
                 if source_dir else [])
        pairs = sources.multi30k(_MULTI30K_SPLITS[split], src_lang, tgt_lang, data_dir,
                                 source_dir)
        return pairs, files
    if dataset == "wmt14":
        return sources.wmt14(_WMT14_SPLITS[split], src_lang, tgt_lang, data_dir), []
    if dataset == "ptb":
        archive = treebank.default_ptb_archive(source_dir)
        sentences, linearized = treebank.task_pairs(treebank.sample_splits(str(archive))[split])
        return tf.data.Dataset.from_tensor_slices((sentences, linearized)), [archive]
    src, tgt = (text_files or {}).get(split, (None, None))
    if src is None:
        return None, []
    return sources.parallel_text(src, tgt)[0], [src, tgt]


def vocabulary_symbols(dataset, source_dir=None):
    """Tokens that must each be one vocabulary piece: every bracket and POS tag for "ptb"."""
    if dataset != "ptb":
        return ()
    archive = treebank.default_ptb_archive(source_dir)
    return tuple(treebank.tree_symbols(treebank.sample_splits(str(archive))["train"]))


def pair_texts(pairs, limit=None):
    """A dataset of text pairs -> (source strings, target strings), at most `limit` pairs."""
    if limit:
        pairs = pairs.take(limit)
    items = list(pairs.as_numpy_iterator())
    return [s.decode("utf-8") for s, _ in items], [t.decode("utf-8") for _, t in items]


def split_texts(dataset, split, src_lang="en", tgt_lang="de", limit=None, **where):
    """(source strings, target strings) of a split, at most `limit` pairs; `where` as for
    `load_pairs` (data_dir, source_dir, text_files)."""
    pairs, _ = load_pairs(dataset, split, src_lang, tgt_lang, **where)
    if pairs is None:
        raise DataError(f"The {dataset} dataset has no {split} set here: give source and "
                        "reference files for it.")
    return pair_texts(pairs, limit)
