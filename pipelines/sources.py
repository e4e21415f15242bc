"""Sources: tf.data datasets of (source text, target text) string pairs.

- `parallel_text(src, tgt)`: a user's own corpus, two line-aligned files (plain or .gz);
- `multi30k(split, src_lang, tgt_lang)`: the registered tfds builder in `pipelines.multi30k`;
- `wmt14(split, src_lang, tgt_lang)`: tensorflow-datasets' own `wmt14_translate` builders.

Every source checks its input before training starts: a missing file, files of different line
counts, invalid UTF-8 or files with no pair to read (empty, or every pair with an empty side)
raise a `DataError` that names the file (and line); empty pairs are skipped and counted.
"""

import dataclasses
import gzip
import itertools
import logging
import os
import pathlib

from pipelines.errors import DataError  # noqa: F401  (raised here; imported from here by users)

log = logging.getLogger(__name__)


@dataclasses.dataclass
class SourceStats:
    """What a source read: pairs kept, and pairs skipped because a side was empty."""

    pairs: int = 0
    empty_skipped: int = 0


def _open_text(path):
    path = pathlib.Path(path)
    if not path.is_file():
        raise DataError(f"File not found: {path}")
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def no_pairs(src_path, tgt_path, src_lines, tgt_lines):
    """The DataError of parallel files with no pair to read, given their line counts."""
    empty = [str(path) for path, lines in ((src_path, src_lines), (tgt_path, tgt_lines))
             if not lines]
    if empty:
        what = f"{' and '.join(empty)} {'is' if len(empty) == 1 else 'are'} empty"
    elif src_lines == tgt_lines:
        what = (f"each of the {src_lines} lines of {src_path} and {tgt_path} has an empty "
                "side (such pairs are skipped)")
    else:
        what = (f"no line pair of {src_path} ({src_lines} lines) and {tgt_path} "
                f"({tgt_lines}) has text on both sides (such pairs are skipped)")
    return DataError(f"No sentence pairs to read: {what}. Give line-aligned files with at "
                     "least one pair of non-empty lines (one sentence per line).")


def check_has_pairs(src_path, tgt_path):
    """Reads both files up to their first pair with text on both sides: a cheap check, made
    before anything is written, that the full read (`check_parallel_files`) will find one.

    Raises:
        DataError naming the files: missing, or with no pair to read (`no_pairs`).
    """
    lines = [0, 0]
    with _open_text(src_path) as src, _open_text(tgt_path) as tgt:
        for src_line, tgt_line in itertools.zip_longest(src, tgt, fillvalue=b""):
            lines[0] += bool(src_line)
            lines[1] += bool(tgt_line)
            if src_line.strip() and tgt_line.strip():
                return
    raise no_pairs(src_path, tgt_path, *lines)


def check_parallel_files(src_path, tgt_path):
    """Streams both files once: equal line counts, valid UTF-8, empty pairs counted, at least
    one pair kept.

    Returns:
        SourceStats.

    Raises:
        DataError naming the file, the line or both line counts.
    """
    stats = SourceStats()
    with _open_text(src_path) as src, _open_text(tgt_path) as tgt:
        line = 0
        while True:
            src_line, tgt_line = src.readline(), tgt.readline()
            if not src_line and not tgt_line:
                break
            if not src_line or not tgt_line:
                # One file ended early: count the rest of the longer one for the message.
                longer = tgt if not src_line else src
                rest = 1 + sum(1 for _ in longer)
                n_src = line + (rest if src_line else 0)
                n_tgt = line + (rest if tgt_line else 0)
                raise DataError(
                    f"Parallel files have different line counts: {src_path} has {n_src} lines, "
                    f"{tgt_path} has {n_tgt}. Line i of one must translate line i of the other."
                )
            line += 1
            texts = []
            for path, raw in ((src_path, src_line), (tgt_path, tgt_line)):
                try:
                    texts.append(raw.decode("utf-8"))
                except UnicodeDecodeError as error:
                    raise DataError(
                        f"{path}, line {line}: invalid UTF-8 ({error.reason} at byte "
                        f"{error.start}). Convert the file to UTF-8 (e.g. with iconv)."
                    ) from None
            if texts[0].strip() and texts[1].strip():
                stats.pairs += 1
            else:
                stats.empty_skipped += 1
    if not stats.pairs:
        raise no_pairs(src_path, tgt_path, line, line)
    return stats


def _lines(path):
    import tensorflow as tf

    compression = "GZIP" if str(path).endswith(".gz") else ""
    return tf.data.TextLineDataset(str(path), compression_type=compression)


def _strip_and_keep(src, tgt):
    """Batches of pairs -> the pairs whose sides are both non-empty after stripping (the last
    batches of unchecked files of different lengths are cut to the shorter, as zip would)."""
    import tensorflow as tf

    rows = tf.minimum(tf.size(src), tf.size(tgt))
    src, tgt = tf.strings.strip(src[:rows]), tf.strings.strip(tgt[:rows])
    keep = tf.logical_and(tf.strings.length(src) > 0, tf.strings.length(tgt) > 0)
    return tf.boolean_mask(src, keep), tf.boolean_mask(tgt, keep)


CHUNK = 1024  # pairs cleaned together (per-element tf.data functions cost more than the work)


def drop_empty_pairs(chunk=CHUNK):
    """Dataset -> Dataset: strips both sides and removes pairs where either is empty, a chunk
    of pairs at a time."""

    def apply(dataset):
        return dataset.batch(chunk).map(_strip_and_keep).unbatch()

    return apply


def parallel_text(src_path, tgt_path, check=True):
    """A user's parallel corpus as (source, target) string pairs.

    Args:
        src_path, tgt_path: line-aligned UTF-8 files, plain or gzip (.gz).
        check: stream both files once first (line counts, UTF-8, empty pairs).

    Returns:
        (dataset, SourceStats or None).
    """
    stats = check_parallel_files(src_path, tgt_path) if check else None
    if stats and stats.empty_skipped:
        log.warning("%s / %s: skipping %d pairs with an empty side (%d pairs kept)",
                    src_path, tgt_path, stats.empty_skipped, stats.pairs)
    import tensorflow as tf

    # Lines are read, zipped and cleaned a chunk at a time, then handed on one pair at a time.
    dataset = tf.data.Dataset.zip((_lines(src_path).batch(CHUNK), _lines(tgt_path).batch(CHUNK)))
    return dataset.map(_strip_and_keep).unbatch(), stats


ASCII_WHITESPACE = " \t\n\r\f\v"  # what tf.strings.strip removes


def read_parallel_text(src_path, tgt_path, limit=None):
    """A parallel corpus as two lists of strings, in plain Python (no TensorFlow): checked as
    `parallel_text` checks it, each side stripped, pairs with an empty side skipped.

    Returns:
        (source strings, target strings), at most `limit` pairs.
    """
    check_parallel_files(src_path, tgt_path)
    sources_, targets = [], []
    with _open_text(src_path) as src, _open_text(tgt_path) as tgt:
        for src_line, tgt_line in zip(src, tgt):
            if limit is not None and len(sources_) >= limit:
                break
            src_text = src_line.decode("utf-8").strip(ASCII_WHITESPACE)
            tgt_text = tgt_line.decode("utf-8").strip(ASCII_WHITESPACE)
            if src_text and tgt_text:
                sources_.append(src_text)
                targets.append(tgt_text)
    return sources_, targets


def default_multi30k_dir():
    """The local Multi30k raw files: $MULTI30K_DIR, else ../shared/data/multi30k if present."""
    candidates = [os.environ.get("MULTI30K_DIR")]
    here = pathlib.Path(__file__).resolve().parents[1]
    candidates += [pathlib.Path.cwd().parent / "shared/data/multi30k",
                   here.parent / "shared/data/multi30k"]
    for candidate in candidates:
        if candidate and pathlib.Path(candidate).is_dir():
            return pathlib.Path(candidate)
    return None


def tfds_bars_follow_stderr():
    """tensorflow-datasets draws its own nested tqdm bars (carriage returns and cursor moves);
    where stderr is a file or a pipe (`make demo > demo.log`) they are turned off, so that a log
    keeps one line per refresh. tfds still says what it downloads and prepares. On a terminal
    they stay as the user has set them."""
    import sys

    from pipelines.progress import is_terminal

    if not is_terminal(sys.stderr):
        import tensorflow_datasets as tfds

        tfds.disable_progress_bar()


def multi30k(split, src_lang="en", tgt_lang="de", data_dir=None, source_dir=None):
    """Multi30k task 1 through its tfds builder (prepared on first use).

    Args:
        split: "train", "val" or "test2016".
        src_lang, tgt_lang: two of "en", "de", "fr".
        data_dir: where tfds keeps prepared datasets (tfds default when None).
        source_dir: folder with the raw `{split}.{lang}.gz` files; default
            `default_multi30k_dir()`, else the files are downloaded from their public URL.
    """
    from pipelines.multi30k import LANGUAGES, SPLITS, Multi30k

    for lang in (src_lang, tgt_lang):
        if lang not in LANGUAGES:
            # A language the builder does not hold (Czech, 2018) is read from the raw files.
            folder = pathlib.Path(source_dir or default_multi30k_dir() or ".")
            files = [folder / f"{SPLITS[split]}.{side}.gz" for side in (src_lang, tgt_lang)]
            if all(f.is_file() for f in files):
                return parallel_text(*files)[0]
            raise DataError(f"Multi30k has no language {lang!r}; choose from {LANGUAGES} "
                            f"(or put the raw files {files[0].name}, {files[1].name} in "
                            f"{folder}).")
    builder = Multi30k(data_dir=data_dir, source_dir=source_dir or default_multi30k_dir())
    tfds_bars_follow_stderr()
    builder.download_and_prepare()
    dataset = builder.as_dataset(split=split, shuffle_files=False)
    return dataset.map(lambda ex: (ex[src_lang], ex[tgt_lang])).apply(drop_empty_pairs())


WMT14_PAIRS = {"de", "fr"}


def wmt14(split, src_lang="en", tgt_lang="de", data_dir=None, download=True):
    """WMT 2014 through tensorflow-datasets' `wmt14_translate/{de,fr}-en` builders.

    Splits: "train", "validation" (newstest2013), "test" (newstest2014). Either direction.
    """
    import tensorflow_datasets as tfds

    other = ({src_lang, tgt_lang} - {"en"})
    if "en" not in (src_lang, tgt_lang) or len(other) != 1 or not other <= WMT14_PAIRS:
        raise DataError(
            f"WMT14 pairs are en-de and en-fr (either direction); got {src_lang}-{tgt_lang}."
        )
    name = f"wmt14_translate/{other.pop()}-en"
    # A fixed order: prepared data is cut into shards by position (training shuffles them).
    tfds_bars_follow_stderr()
    dataset = tfds.load(name, split=split, data_dir=data_dir, download=download,
                        shuffle_files=False)
    return dataset.map(lambda ex: (ex[src_lang], ex[tgt_lang])).apply(drop_empty_pairs())
