"""The dataset registry: a dataset name and a split -> (source, target) text pairs.

Functions of plain arguments (names, languages, folders); nothing here knows the model or the
training config.

    pairs = load_pairs("multi30k", "train", "en", "de")
    sources, references = split_texts("multi30k", "test", "en", "de")
    Mixing("multi30k", "en", ["de", "fr"], 5.0, 0, {}).pairs()  # several pairs, tagged, mixed

Datasets:
- "multi30k": Multi30k task 1 (train / val / test2016) from local raw files
  (`sources.default_multi30k_dir()`: $MULTI30K_DIR, else ../shared/data/multi30k), else
  downloaded through its tfds builder;
- "wmt14": tensorflow-datasets' `wmt14_translate` (train / newstest2013 / newstest2014);
- "text": the user's own line-aligned files (`text_files`);
- "ptb": constituency parsing on the Penn Treebank sample (sentence -> linearized tree).
"""

import hashlib
import pathlib

from pipelines import multilingual, treebank
from pipelines.defaults import MAX_LENGTH, SHARD_PAIRS, VOCAB_SIZE
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
        a tf.data.Dataset of (source, target) strings, or None when a "text" dataset has no
        files for the split.
    """
    _check(dataset, split)
    from pipelines import sources

    if dataset == "multi30k":
        return sources.multi30k(_MULTI30K_SPLITS[split], src_lang, tgt_lang, data_dir,
                                source_dir or sources.default_multi30k_dir())
    if dataset == "wmt14":
        return sources.wmt14(_WMT14_SPLITS[split], src_lang, tgt_lang, data_dir)
    if dataset == "ptb":
        archive = treebank.default_ptb_archive(source_dir)
        sentences, linearized = treebank.task_pairs(treebank.sample_splits(str(archive))[split])
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices((sentences, linearized))
    src, tgt = (text_files or {}).get(split, (None, None))
    if src is None:
        return None
    return sources.parallel_text(src, tgt)[0]


def has_split(dataset, split, *_, text_files=None, **__):
    """Whether `split` of `dataset` can be read here: always, except for a "text" dataset
    without files for it (`where` as for `load_pairs`)."""
    _check(dataset, split)
    return dataset != "text" or bool((text_files or {}).get(split, (None, None))[0])


def check_has_pairs(dataset, split, *_, text_files=None, **__):
    """Refuses a "text" split whose files have no pair to read (empty, or every pair with an
    empty side) or are missing: DataError naming them. It reads up to the first pair, so that
    a job can check its data before it writes anything (`where` as for `load_pairs`). Other
    datasets, and a "text" dataset without files for the split, pass."""
    _check(dataset, split)
    src, tgt = (text_files or {}).get(split, (None, None))
    if dataset == "text" and src and tgt:
        from pipelines import sources

        sources.check_has_pairs(src, tgt)


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


_MULTI30K_STEMS = {"train": "train", "dev": "val", "test": "test_2016_flickr"}


def local_text_files(dataset, split, src_lang="en", tgt_lang="de", *, source_dir=None,
                     text_files=None, **_):
    """The two local files a split's pairs are read from ("text" files, the raw Multi30k
    files), or None when the split comes from elsewhere (a tfds download, the PTB archive)."""
    _check(dataset, split)
    if dataset == "text":
        src, tgt = (text_files or {}).get(split, (None, None))
        return (src, tgt) if src else None
    if dataset == "multi30k":
        from pipelines import sources

        folder = source_dir or sources.default_multi30k_dir()
        if folder:
            files = tuple(pathlib.Path(folder) / f"{_MULTI30K_STEMS[split]}.{lang}.gz"
                          for lang in (src_lang, tgt_lang))
            if all(f.is_file() for f in files):
                return files
    return None


def split_texts(dataset, split, src_lang="en", tgt_lang="de", limit=None, **where):
    """(source strings, target strings) of a split, at most `limit` pairs; `where` as for
    `load_pairs` (data_dir, source_dir, text_files).

    Under a backend other than TensorFlow, or in a process that has not loaded Keras (the
    CTranslate2 engine's commands), local files are read in plain Python (the same pairs as
    through tf.data), so that evaluating needs no TensorFlow."""
    import sys

    files = local_text_files(dataset, split, src_lang, tgt_lang, **where)
    keras = sys.modules.get("keras")
    if files and (keras is None or keras.backend.backend() != "tensorflow"):
        from pipelines import sources

        return sources.read_parallel_text(*files, limit=limit)
    pairs = load_pairs(dataset, split, src_lang, tgt_lang, **where)
    if pairs is None:
        raise DataError(f"The {dataset} dataset has no {split} set here: give source and "
                        "reference files for it.")
    return pair_texts(pairs, limit)


def official_tokenized_references(dataset, split, lang, source_dir=None):
    """The official lowercased, normalized, tokenized references of a Multi30k val or test2016
    split (`tok/*.lc.norm.tok.LANG` beside the raw files) as a list of lines, or None when the
    dataset has none or the file is not here."""
    if dataset != "multi30k" or split not in ("dev", "test"):
        return None
    from pipelines import sources

    source_dir = source_dir or sources.default_multi30k_dir()
    stem = {"dev": "val", "test": "test_2016_flickr"}[split]
    path = pathlib.Path(source_dir or ".") / "tok" / f"{stem}.lc.norm.tok.{lang}"
    if not source_dir or not path.is_file():
        return None
    return path.read_text(encoding="utf-8").splitlines()


def _train_files(dataset, src_lang, tgt_lang, source_dir, text_files):
    """The local files a dataset's training pairs come from ([] for tfds downloads)."""
    _check(dataset, "train")
    if dataset == "multi30k":
        from pipelines import sources

        source_dir = source_dir or sources.default_multi30k_dir()
        return [pathlib.Path(source_dir) / f"train.{lang}.gz" for lang in (src_lang, tgt_lang)] \
            if source_dir else []
    if dataset == "ptb":
        return [treebank.default_ptb_archive(source_dir)]
    if dataset == "text":
        return [f for f in (text_files or {}).get("train", ()) if f]
    return []


def _size(dataset, src_lang, tgt_lang, data_dir):
    """The number of training pairs when tfds knows it (for a progress bar), else None."""
    if dataset != "wmt14":
        return None
    try:
        import tensorflow_datasets as tfds

        other = ({src_lang, tgt_lang} - {"en"}).pop()
        builder = tfds.builder(f"wmt14_translate/{other}-en", data_dir=data_dir)
        return builder.info.splits["train"].num_examples or None
    except Exception:  # noqa: BLE001 -- only a progress bar's total
        return None


def source_identity(dataset, src_lang, tgt_lang, *, data_dir=None, source_dir=None,
                    text_files=None):
    """What the training pairs of a dataset are read from, as JSON (a cache key's part): local
    files by absolute path, size and modification time; tfds builders by name, version and
    data_dir."""
    files = _train_files(dataset, src_lang, tgt_lang, source_dir, text_files)
    identity = {"dataset": dataset, "src_lang": src_lang, "tgt_lang": tgt_lang}
    if files and all(pathlib.Path(f).is_file() for f in files):
        identity["files"] = [{"path": str(pathlib.Path(f).resolve()),
                              "bytes": pathlib.Path(f).stat().st_size,
                              "mtime_ns": pathlib.Path(f).stat().st_mtime_ns} for f in files]
    else:
        identity["tfds"] = {"multi30k": "multi30k", "wmt14": "wmt14_translate"}.get(dataset)
        identity["data_dir"] = str(pathlib.Path(data_dir).resolve()) if data_dir else None
    return identity


def count_pairs(dataset):
    """The number of elements of a finite tf.data dataset (read through once)."""
    import numpy as np

    return int(dataset.reduce(np.int64(0), lambda count, _: count + 1).numpy())


class Mixing:
    """The training data of several pairs as one corpus to prepare: its identity (the data
    cache's key), its folder name and its mixed, tagged pairs (`multilingual`: the tags and
    the mixing by temperature).

    Args:
        dataset: a dataset name (`load_pairs`).
        src_langs, tgt_langs: one per pair.
        temperature: the pair sampling temperature (None: `multilingual.TEMPERATURE`).
        seed: the order of the mixed stream.
        where: `load_pairs`' keywords, `text_files` being a list of each pair's {split: files}.
    """

    def __init__(self, dataset, src_langs, tgt_langs, temperature, seed, where):
        self.dataset, self.seed = dataset, seed
        self.temperature = multilingual.TEMPERATURE if temperature is None else temperature
        files = where.get("text_files")
        files = files if isinstance(files, (list, tuple)) else [files] * len(tgt_langs)
        common = {key: value for key, value in where.items() if key != "text_files"}
        sources = src_langs if isinstance(src_langs, (list, tuple)) else [src_langs] * len(
            tgt_langs)
        self.pairs_where = [(src, tgt, dict(common, text_files=text_files))
                            for src, tgt, text_files in zip(sources, tgt_langs, files)]
        self.name = f"{dataset}-{sources[0]}-{'+'.join(tgt_langs)}"

    def identity(self):
        return {"pairs": [source_identity(self.dataset, src, tgt, **where)
                          for src, tgt, where in self.pairs_where],
                "tags": "source", "temperature": self.temperature, "seed": self.seed}

    def pairs(self):
        """The mixed stream of tagged (source, target) pairs (one pass)."""
        import tensorflow as tf

        parts, sizes = [], []
        for src, tgt, where in self.pairs_where:
            pairs = load_pairs(self.dataset, "train", src, tgt, **where)
            if pairs is None:
                raise DataError(f"The {self.dataset} dataset has no training files for "
                                f"{src}-{tgt}: give them (train_src / train_tgt).")
            prefix = tf.constant(multilingual.tag(tgt) + " ")
            parts.append(pairs.map(lambda s, t, prefix=prefix: (tf.strings.join([prefix, s]), t)))
            sizes.append(count_pairs(pairs))
        return multilingual.mixed_pairs(parts, sizes, self.temperature, self.seed)


def prepare_training_data(dataset, src_lang="en", tgt_lang="de", *, cache_dir=None,
                          vocab_size=VOCAB_SIZE, vocabulary=None, seed=0, vocabulary_sample=None,
                          max_length=MAX_LENGTH, shard_pairs=SHARD_PAIRS, progress=True,
                          verify=False, pair_sampling_temperature=None,
                          **where):
    """The prepared training data of a dataset (`pipelines.prepared`), from the cache when it
    was prepared before with the same source, vocabulary and settings, else prepared now.

    Args:
        dataset, src_lang, tgt_lang: as for `load_pairs`; `where` too (data_dir, source_dir,
            text_files).
        cache_dir: the cache (default `prepared.default_cache_dir()`); the data goes into
            `cache_dir / DATASET-SRC-TGT-KEY`.
        vocab_size, seed: the shared vocabulary trained on a sample of the training text...
        vocabulary: ...or this sentencepiece model (bytes) instead.
        vocabulary_sample: at most this many sentences (both sides) train the vocabulary
            (default `tokenizer_settings`' 2,000,000), drawn uniformly while streaming.
        max_length: longer pairs (with their specials) are dropped.
        shard_pairs: source pairs per shard (None: `defaults.SHARD_PAIRS`).
        verify: check the shards' checksums (missing or truncated shards are always found);
            damaged shards are prepared again.
        pair_sampling_temperature: several pairs (src_lang and tgt_lang lists, one per pair,
            and `text_files` a list of each pair's {split: files}): the tagged pairs mixed by
            this temperature (`pipelines.multilingual`); the tags are reserved pieces.

    Returns:
        `prepared.PreparedData`.
    """
    from pipelines import prepared
    from pipelines.vocabulary import tokenizer_settings

    shard_pairs = shard_pairs or SHARD_PAIRS
    several = isinstance(tgt_lang, (list, tuple))
    symbols = vocabulary_symbols(dataset, where.get("source_dir"))
    if several:
        symbols += tuple(multilingual.tag(lang) for lang in tgt_lang)
        mixing = Mixing(dataset, src_lang, tgt_lang, pair_sampling_temperature, seed, where)
    settings = tokenizer_settings(vocab_size, seed=seed, user_symbols=symbols,
                                  **({"sample_size": vocabulary_sample} if vocabulary_sample
                                     else {}))
    source = mixing.identity() if several else source_identity(dataset, src_lang, tgt_lang,
                                                                **where)
    cache_dir = pathlib.Path(cache_dir) if cache_dir else prepared.default_cache_dir()

    def folder(vocabulary_key):
        manifest = {"source": source, "vocabulary": vocabulary_key, "max_length": max_length,
                    "shard_pairs": shard_pairs}
        key = prepared.cache_key(manifest)
        name = dataset if dataset == "ptb" else (
            mixing.name if several else f"{dataset}-{src_lang}-{tgt_lang}")
        return cache_dir / f"{name}-{key}", manifest

    # Data prepared with a vocabulary trained with these settings; for a given vocabulary
    # (a run's own), that data if it was made with it, else data keyed by the vocabulary.
    directory, manifest = folder(settings)
    if vocabulary is not None:
        own = hashlib.sha256(bytes(vocabulary)).hexdigest()
        if not (prepared.PreparedData.is_complete(directory) and
                prepared.PreparedData(directory).statistics["vocabulary_sha256"] == own):
            directory, manifest = folder({"sha256": own})
    loaded = []

    def pairs():  # read (and its files checked) only when something must be prepared
        if not loaded:
            loaded.append(mixing.pairs() if several else
                          load_pairs(dataset, "train", src_lang, tgt_lang, **where))
        if loaded[0] is None:
            raise DataError(f"The {dataset} dataset has no training files: give them "
                            "(train_src / train_tgt).")
        return loaded[0]

    train_settings = {key: value for key, value in settings.items() if key != "version"}
    return prepared.prepare(directory, pairs, manifest=manifest,
                            vocabulary=vocabulary, vocabulary_settings=train_settings,
                            max_length=max_length, shard_pairs=shard_pairs, progress=progress,
                            total_pairs=None if several else _size(dataset, src_lang, tgt_lang,
                                                                   where.get("data_dir")),
                            verify=verify)
