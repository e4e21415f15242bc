"""XLA where it wins: the shape buckets (the same outputs as the plain graph search), the
persistent compilation cache of the command, and the `auto` choice with its reason."""

import argparse
import os
import subprocess
import sys

import numpy as np
import pytest

from keras_transformer.cli import compilation_cache
from keras_transformer.decoding.engines.xla import MEASURED, resolve_xla
from keras_transformer.decoding.search.compiling import (
    bucket_rows, bucket_width, pad_rows, unpad_rows)
from pipelines.special_ids import EOS_ID

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- buckets -----------------------------------------------------------------------------------
def test_rows_go_to_powers_of_two_up_to_the_batch_size():
    assert [bucket_rows(n, 64) for n in (1, 2, 3, 5, 33, 64)] == [1, 2, 4, 8, 64, 64]
    assert [bucket_rows(n, 100) for n in (65, 100)] == [100, 100]
    assert bucket_rows(130, 64) == 256  # more than a batch (an n-best list's alignments)


def test_widths_go_to_a_few_steps_capped_at_the_longest_input():
    assert [bucket_width(w) for w in (1, 16, 17, 48, 64, 65, 96, 97, 128, 129, 200, 300)] == \
        [16, 16, 32, 48, 64, 96, 96, 128, 128, 192, 256, 384]
    assert bucket_width(40, cap=36) == 40 and bucket_width(30, cap=36) == 32
    assert bucket_width(33, cap=36) == 36


def test_padding_rows_repeat_the_first_and_are_cut_off():
    rows = np.arange(6).reshape(3, 2)
    padded = pad_rows(rows, 4)
    assert padded.tolist() == [[0, 1], [2, 3], [4, 5], [0, 1]]
    assert unpad_rows({"ids": padded, "scores": padded[:, 0]}, 3)["scores"].tolist() == [0, 2, 4]


@pytest.fixture(scope="module")
def random_model(tiny_run):
    """A tiny Transformer with random weights in the run's vocabulary: varied outputs, long
    and short, unlike a 20-step model's."""
    from keras_transformer.runs import open_run
    from tests.search_helpers import tiny_model

    run = open_run(tiny_run)
    return tiny_model(run.config.vocab_size, seed=3), run.vocabulary()


def _source_rows(count, vocab_size, seed=0):
    rng = np.random.default_rng(seed)
    rows = [list(rng.integers(4, vocab_size, length)) + [EOS_ID]
            for length in rng.integers(1, 20, count)]
    ids = np.zeros((count, max(map(len, rows))), np.int32)
    for number, row in enumerate(rows):
        ids[number, : len(row)] = row
    return ids


# XLA compilations (beam 4 a second set of programs): in `make test` only.
@pytest.mark.slow
@pytest.mark.parametrize("beam_size", [1, 4])
def test_bucketed_xla_search_finds_what_the_plain_graph_search_finds(random_model, beam_size):
    """5 sentences of 2-20 tokens on a bucket of 8 rows and 32 columns (padding rows and
    columns), under XLA, against the plain graph search of the exact batch: the same ids for
    every sentence, scores within float tolerance (XLA may sum in another order)."""
    from keras_transformer.decoding.engines.translator import Translator

    model, vocabulary = random_model
    options = dict(beam_size=beam_size, alpha=0.6, batch_size=8, precision="float32",
                   extra_length=10)
    plain = Translator(model, vocabulary, jit_compile=False, **options)
    xla = Translator(model, vocabulary, jit_compile=True, **options)
    shapes = []
    search = xla._search
    xla._search = lambda ids: shapes.append(np.shape(ids)) or search(ids)
    source = _source_rows(5, model.vocab_size)
    expected = plain.search_ids(source)
    found = xla.search_ids(xla._padded([list(row[row > 0]) for row in source]))
    assert shapes == [(8, 32)]  # 5 rows -> 8, 20 columns -> 32
    expected_ids, found_ids = np.asarray(expected["ids"]), np.asarray(found["ids"])
    assert found_ids.shape[0] == 5
    for row in range(5):
        for k in range(expected_ids.shape[1]):
            want = [t for t in expected_ids[row, k].tolist() if t]
            assert [t for t in found_ids[row, k].tolist() if t] == want, (row, k)
    np.testing.assert_allclose(np.asarray(found["scores"]), np.asarray(expected["scores"]),
                               rtol=1e-4, atol=1e-4)
    assert len({int((row > 0).sum()) for row in expected_ids[:, 0]}) > 1  # varied lengths


@pytest.mark.slow  # XLA compilations
def test_bucketed_xla_scores_equal_the_plain_graph_scores(random_model):
    from keras_transformer.decoding.engines.translator import Translator

    model, vocabulary = random_model
    options = dict(batch_size=8, precision="float32")
    sources = ["a dog runs", "the red cat sleeps in the big house", "hello"]
    targets = ["ein Hund", "die rote Katze schläft", "hallo welt und mehr"]
    expected = Translator(model, vocabulary, jit_compile=False, **options).score(sources,
                                                                                 targets)
    found = Translator(model, vocabulary, jit_compile=True, **options).score(sources, targets)
    assert [f["tokens"] for f in found] == [e["tokens"] for e in expected]
    np.testing.assert_allclose([f["log_prob"] for f in found],
                               [e["log_prob"] for e in expected], rtol=1e-4, atol=1e-4)


# -- auto ----------------------------------------------------------------------------------------
def test_auto_turns_xla_on_only_where_it_was_measured_faster():
    for (kind, precision), (on, _) in MEASURED.items():
        flags = {"amx": {"amx_bf16"}, "avx512_bf16": {"avx512_bf16"}, "avx512": {"avx512f"},
                 "avx2": {"avx2"}}[kind]
        assert resolve_xla(None, precision, flags=flags, backend="tensorflow")[0] is on
    on, reason = resolve_xla(None, "float32", flags={"sse2"}, backend="tensorflow")
    assert not on and reason.startswith("auto: not measured faster on the other class")
    assert resolve_xla(True, flags={"sse2"}) == (True, "--xla given")
    assert resolve_xla(False, flags={"amx_bf16"}) == (False, "--no-xla given")
    assert resolve_xla(None, backend="jax")[0] is True


def test_the_decoder_line_says_xla_and_why(tiny_run):
    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.decoding.request import Request
    from keras_transformer.runs.settings import FLAG

    line = Decoder(Request()).describe()
    on, why = resolve_xla(None, Decoder(Request()).precision[0])
    assert f"xla {'on' if on else 'off'} [{why}]" in line and why.startswith("auto: ")
    assert "xla on [flag]" in Decoder.resolve(None, {"xla": True}, FLAG).describe()
    assert "xla off [flag]" in Decoder.resolve(None, {"xla": False}, FLAG).describe()
    assert "xla" not in Decoder(Request(engine="ctranslate2"), run=None).request.engine_options()


def test_xla_flags_are_a_switch_with_an_off_and_auto_when_absent():
    from keras_transformer.cli.flags import add_flags
    from keras_transformer.decoding.request import given_flags

    parser = argparse.ArgumentParser()
    add_flags(parser, "translate")
    assert "xla" not in given_flags(parser.parse_args([]), "translate")
    assert given_flags(parser.parse_args(["--xla"]), "translate")["xla"] is True
    assert given_flags(parser.parse_args(["--no-xla"]), "translate")["xla"] is False


# -- the persistent compilation cache --------------------------------------------------------------
def test_the_cache_folder_is_per_cpu_and_compiler_and_can_be_moved_or_turned_off(tmp_path):
    environ = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    folders = compilation_cache.setup(environ, flags={"avx2"})
    tf_folder = folders["tensorflow"]
    assert tf_folder.is_dir() and tf_folder.parent.parent == tmp_path / "xdg" / \
        "keras-transformer" / "xla"
    assert tf_folder.name.startswith("avx2-")
    assert environ["TF_XLA_FLAGS"] == f"--tf_xla_persistent_cache_directory={tf_folder}"
    environ = {"KERAS_TRANSFORMER_XLA_CACHE": str(tmp_path / "mine"),
               "TF_XLA_FLAGS": "--tf_xla_auto_jit=0"}
    folder = compilation_cache.setup(environ)["tensorflow"]
    assert folder.is_relative_to(tmp_path / "mine")
    assert environ["TF_XLA_FLAGS"].startswith("--tf_xla_auto_jit=0 ")  # the user's kept
    mine = {"TF_XLA_FLAGS": "--tf_xla_persistent_cache_directory=/elsewhere",
            "KERAS_TRANSFORMER_XLA_CACHE": str(tmp_path / "c")}
    compilation_cache.setup(mine)
    assert mine["TF_XLA_FLAGS"] == "--tf_xla_persistent_cache_directory=/elsewhere"
    off = {"KERAS_TRANSFORMER_XLA_CACHE": "off"}
    assert compilation_cache.setup(off) == {} and "TF_XLA_FLAGS" not in off


# A child process as the command sets itself up (the cache before TensorFlow loads), then one
# XLA search of a tiny model on one shape; prints the cache's files.
CHILD = """
import sys
from keras_transformer.cli import console
console.setup(False, own_console=False)
import numpy as np, keras
from keras_transformer import Transformer
from keras_transformer.decoding.search.greedy import compiled_greedy_search
keras.utils.set_random_seed(0)
model = Transformer.from_preset("tiny", vocab_size=40, dropout=0.0, num_layers=1)
model.build()
compiled_greedy_search(model, extra_length=5, jit_compile=True)(
    np.array([[5, 6, 7, 2, 0, 0, 0, 0]], np.int32))
from keras_transformer.cli.compilation_cache import folders
print(sorted(p.name for p in folders()["tensorflow"].iterdir()))
"""


@pytest.mark.slow
def test_a_second_process_finds_every_program_in_the_cache(tmp_path):
    """The first process writes the compiled search to the cache; the second writes nothing
    new: every program it needed was found there."""
    environ = {**os.environ, "KERAS_TRANSFORMER_XLA_CACHE": str(tmp_path / "cache")}
    environ.pop("TF_XLA_FLAGS", None)
    listed = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", CHILD], env=environ, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        listed.append(done.stdout.strip().splitlines()[-1])
    assert "xla_compile_cache" in listed[0]
    assert listed[1] == listed[0]
