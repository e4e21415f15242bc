"""Multi30k task 1 (Elliott et al., 2016) as a tensorflow-datasets builder.

Splits train (29000 pairs), val (1014) and test2016 (1000); each example holds the same caption
in English, German and French. The raw files are read from a local folder when given (for this
project `../shared/data/multi30k`), otherwise downloaded from the dataset's public repository.
"""

import gzip
import pathlib

import tensorflow_datasets as tfds

from pipelines.errors import DataError

LANGUAGES = ("en", "de", "fr")
SPLITS = {"train": "train", "val": "val", "test2016": "test_2016_flickr"}
URL = "https://github.com/multi30k/dataset/raw/master/data/task1/raw/{stem}.{lang}.gz"

_CITATION = """@inproceedings{elliott-etal-2016-multi30k,
  title = {Multi30K: Multilingual English-German Image Descriptions},
  author = {Elliott, Desmond and Frank, Stella and Sima'an, Khalil and Specia, Lucia},
  booktitle = {Proceedings of the 5th Workshop on Vision and Language},
  year = {2016}, pages = {70--74}}"""


class Multi30k(tfds.core.GeneratorBasedBuilder):
    """Multi30k task 1: image captions in en, de and fr, aligned line by line."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Raw (cased, untokenized) task 1 text."}

    def __init__(self, *, source_dir=None, **kwargs):
        self.source_dir = pathlib.Path(source_dir) if source_dir else None
        super().__init__(**kwargs)

    def _info(self):
        return self.dataset_info_from_configs(
            description="Multi30k task 1: Flickr30k captions with German and French "
            "translations (research and education use).",
            features=tfds.features.FeaturesDict(
                {lang: tfds.features.Text() for lang in LANGUAGES}
            ),
            homepage="https://github.com/multi30k/dataset",
            citation=_CITATION,
            # Keep the files' order: hypotheses of val/test line up with the raw references.
            disable_shuffling=True,
        )

    def _split_generators(self, dl_manager):
        files = {}
        for split, stem in SPLITS.items():
            for lang in LANGUAGES:
                local = self.source_dir / f"{stem}.{lang}.gz" if self.source_dir else None
                if local is not None and local.is_file():
                    files[split, lang] = local
                else:
                    files[split, lang] = None
        missing = {key: URL.format(stem=SPLITS[key[0]], lang=key[1])
                   for key, path in files.items() if path is None}
        if missing:
            downloaded = dl_manager.download({f"{s}.{l}": url for (s, l), url in missing.items()})
            for (s, l) in missing:
                files[s, l] = pathlib.Path(downloaded[f"{s}.{l}"])
        return {
            split: self._generate_examples({lang: files[split, lang] for lang in LANGUAGES})
            for split in SPLITS
        }

    def _generate_examples(self, paths):
        columns = {}
        for lang, path in paths.items():
            with gzip.open(path, "rt", encoding="utf-8") as handle:
                columns[lang] = handle.read().split("\n")
            if columns[lang] and columns[lang][-1] == "":
                columns[lang].pop()
        counts = {str(paths[lang]): len(lines) for lang, lines in columns.items()}
        if len(set(counts.values())) != 1:
            raise DataError(f"Multi30k files are not line-aligned: {counts}")
        for i, row in enumerate(zip(*(columns[lang] for lang in LANGUAGES))):
            yield i, dict(zip(LANGUAGES, row))
