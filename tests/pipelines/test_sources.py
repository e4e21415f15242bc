import gzip
import logging
import re
import subprocess
import sys

import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from pipelines import sources
from pipelines.sources import DataError


def write(path, lines, raw=None):
    data = raw if raw is not None else ("\n".join(lines) + "\n").encode("utf-8")
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb") as handle:
            handle.write(data)
    else:
        path.write_bytes(data)
    return path


def decoded(dataset):
    return [(s.decode(), t.decode()) for s, t in dataset.as_numpy_iterator()]


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_parallel_text_reads_plain_and_gzip(tmp_path, suffix):
    src = write(tmp_path / f"a.en{suffix}", ["a dog", "  two cats ", "a bird"])
    tgt = write(tmp_path / f"a.de{suffix}", ["ein Hund", "zwei Katzen", "ein Vogel"])
    dataset, stats = sources.parallel_text(src, tgt)
    assert decoded(dataset) == [("a dog", "ein Hund"), ("two cats", "zwei Katzen"),
                                ("a bird", "ein Vogel")]
    assert stats.pairs == 3 and stats.empty_skipped == 0


def test_different_line_counts_name_both_files_and_counts(tmp_path):
    src = write(tmp_path / "train.en", ["a", "b", "c", "d"])
    tgt = write(tmp_path / "train.de", ["a", "b", "c"])
    with pytest.raises(DataError) as error:
        sources.parallel_text(src, tgt)
    message = str(error.value)
    assert f"{src} has 4 lines" in message and f"{tgt} has 3" in message


def test_missing_file_is_named(tmp_path):
    src = write(tmp_path / "train.en", ["a"])
    with pytest.raises(DataError, match="File not found: .*missing.de"):
        sources.parallel_text(src, tmp_path / "missing.de")


def test_invalid_utf8_names_file_and_line(tmp_path):
    src = write(tmp_path / "train.en", ["fine", "also fine", "bad"])
    tgt = write(tmp_path / "train.de", None, raw=b"gut\nauch gut\nschlecht \xff\xfe\n")
    with pytest.raises(DataError, match=r"train\.de, line 3: invalid UTF-8"):
        sources.parallel_text(src, tgt)


def test_empty_lines_are_skipped_and_counted(tmp_path, caplog):
    src = write(tmp_path / "train.en", ["one", "", "three", "four", "   "])
    tgt = write(tmp_path / "train.de", ["eins", "zwei", "", "vier", "fünf"])
    with caplog.at_level(logging.WARNING):
        dataset, stats = sources.parallel_text(src, tgt)
    assert decoded(dataset) == [("one", "eins"), ("four", "vier")]
    assert (stats.pairs, stats.empty_skipped) == (2, 3)
    assert "skipping 3 pairs with an empty side" in caplog.text


@pytest.mark.slow
def test_multi30k_builder_reads_the_local_files(tmp_path, shared_data):
    expected = {"train": 29000, "val": 1014, "test2016": 1000}
    for split, count in expected.items():
        pairs = sources.multi30k(split, "en", "de", data_dir=tmp_path,
                                 source_dir=shared_data / "multi30k")
        # Counted in the graph (every pair read; 29,000 eager steps cost 6 CPU-s, this 2).
        assert int(pairs.reduce(0, lambda n, _: n + 1)) == count
    # Same order as the raw files, in every language.
    for lang in ("de", "fr"):
        first = next(iter(sources.multi30k("val", "en", lang, data_dir=tmp_path)))
        with gzip.open(shared_data / "multi30k" / f"val.{lang}.gz", "rt", encoding="utf-8") as f:
            assert first[1].numpy().decode() == f.readline().strip()
    # Czech (2018), which the builder does not hold, comes from the raw files (issue 52).
    first = next(iter(sources.multi30k("val", "en", "cs", data_dir=tmp_path)))
    with gzip.open(shared_data / "multi30k" / "val.cs.gz", "rt", encoding="utf-8") as f:
        assert first[1].numpy().decode() == f.readline().strip()


def test_wmt14_goes_through_the_tfds_builder_with_mock_data():
    # tfds.testing.mock_data: the real wmt14_translate builder and its metadata, with generated
    # examples instead of the (unreachable) download.
    with tfds.testing.mock_data(num_examples=6):
        de_en = decoded(sources.wmt14("validation", "de", "en"))
        en_de = decoded(sources.wmt14("validation", "en", "de"))
    assert len(de_en) == len(en_de) == 6
    assert [(t, s) for s, t in de_en] == en_de  # either direction of the same builder
    assert tfds.builder("wmt14_translate/fr-en").info.features["fr"] is not None
    with pytest.raises(DataError, match="en-de and en-fr"):
        sources.wmt14("train", "de", "fr")


def test_real_newstest_files_through_the_text_source(shared_data):
    folder = shared_data / "newstest"
    dataset, stats = sources.parallel_text(folder / "newstest2013.en-de.en",
                                           folder / "newstest2013.en-de.de")
    assert stats.pairs + stats.empty_skipped == 3000
    assert sum(1 for _ in dataset) == stats.pairs
    assert isinstance(next(iter(dataset))[0], tf.Tensor)


def test_multi30k_names_an_unknown_language():
    with pytest.raises(DataError, match="Multi30k has no language 'xx'"):
        sources.multi30k("train", "en", "xx")


@pytest.mark.slow  # a subprocess that imports TensorFlow and prepares the data (about 9 s)
def test_preparing_multi30k_into_a_log_writes_no_redrawn_bars(tmp_path, shared_data):
    # tfds's own nested bars (carriage returns, cursor-up escapes) are off where stderr is a
    # file or a pipe, as ours are lines there.
    code = ("import sys\n"
            "from pipelines import sources\n"
            "pairs = sources.multi30k('val', 'en', 'de', data_dir=sys.argv[1], "
            "source_dir=sys.argv[2])\n"
            "print(sum(1 for _ in pairs))\n")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path),
                             str(shared_data / "multi30k")], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "1014", result.stdout
    assert "\r" not in result.stderr and "\x1b[A" not in result.stderr, result.stderr


def test_files_with_no_pair_to_read_are_named(tmp_path):
    from pipelines import datasets

    empty_src, empty_tgt = write(tmp_path / "e.en", [], raw=b""), write(tmp_path / "e.de", [],
                                                                         raw=b"")
    blank = write(tmp_path / "blank.en", ["", "  ", ""])
    text = write(tmp_path / "text.de", ["eins", "zwei", "drei"])
    is_empty = re.escape(f"No sentence pairs to read: {empty_src} and {empty_tgt} are empty")
    one_side = re.escape(f"each of the 3 lines of {blank} and {text} has an empty side")
    for check in (sources.check_parallel_files, sources.read_parallel_text,
                  sources.check_has_pairs):  # the full read, the plain one, the first pair
        with pytest.raises(DataError, match=is_empty):
            check(empty_src, empty_tgt)
        with pytest.raises(DataError, match=one_side):
            check(blank, text)
    longer = write(tmp_path / "longer.de", ["eins", "zwei", "drei", "vier"])
    with pytest.raises(DataError, match=re.escape(f"no line pair of {blank} (3 lines) and "
                                                  f"{longer} (4) has text on both sides")):
        sources.check_has_pairs(blank, longer)  # the full read names the two line counts
    # The registry's check reads a "text" split's files; other datasets pass unread.
    text_files = {"train": (str(text), str(text)), "dev": (str(empty_src), str(empty_tgt))}
    datasets.check_has_pairs("text", "train", text_files=text_files)
    with pytest.raises(DataError, match=is_empty):
        datasets.check_has_pairs("text", "dev", text_files=text_files)
    datasets.check_has_pairs("multi30k", "dev", text_files=text_files)
