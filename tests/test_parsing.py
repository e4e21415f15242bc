"""Parsing as translation: a tiny model trained briefly on the PTB sample, end to end."""

import pytest

from pipelines.tokenizer import SubwordTokenizer
from pipelines.treebank import read_trees, words


pytestmark = pytest.mark.slow  # trains a parser


@pytest.fixture(scope="module")
def parse_run(tmp_path_factory, shared_data):
    """The train command, run in this process (a child process would only add an import of
    TensorFlow)."""
    from keras_transformer import cli

    run_dir = tmp_path_factory.mktemp("parse") / "run"
    status = cli.main(["train", "--preset", "tiny", "--num-layers", "1", "--dataset", "ptb",
                       "--source-dir",
                       str(shared_data / "ptb-sample"), "--vocab-size", "1200", "--train-steps",
                       "20", "--eval-steps", "20", "--tokens-per-batch", "2048", "--max-length",
                       "256", "--output-dir", str(run_dir), "--verbose", "0", "--no-tune"])
    assert status == 0
    return run_dir


def test_tree_tokens_are_single_pieces(parse_run):
    tokenizer = SubwordTokenizer.load(parse_run / "vocab" / "spm.model")
    import tensorflow as tf

    text = "(S (NP DT NN )NP (VP VBZ )VP . )S"
    ids = tokenizer.tokenize(tf.constant([text])).to_list()[0]
    assert len(ids) == len(text.split())
    assert tokenizer.detokenize(tf.ragged.constant([ids])).numpy()[0].decode() == text


def test_parse_command_gives_one_well_formed_tree_per_sentence(parse_run, tmp_path, capsys):
    from keras_transformer import cli

    source = tmp_path / "in.txt"
    source.write_text("The dog runs .\n\nProfits rose 5 % in the third quarter .\n")
    status = cli.main(["parse", "--run-dir", str(parse_run), "--input", str(source), "--beam",
                       "2"])
    out, err = capsys.readouterr()
    assert status == 0, err[-3000:]
    lines = out.splitlines()
    assert len(lines) == 3 and lines[1] == ""
    for line, sentence in ((lines[0], "The dog runs ."),
                           (lines[2], "Profits rose 5 % in the third quarter .")):
        tree = read_trees(line)[0]  # parses: brackets balanced
        assert words(tree) == sentence.split()  # repaired onto exactly the input words


def test_parse_names_a_line_that_is_not_utf8_and_parses_the_rest(parse_run, tmp_path, capsys):
    from keras_transformer import cli

    source = tmp_path / "in.txt"
    source.write_bytes(b"The dog runs .\nThe \xe9 cat .\nIt rose .\n")
    status = cli.main(["parse", "--run-dir", str(parse_run), "--input", str(source),
                       "--beam", "2"])
    out, err = capsys.readouterr()
    assert status == 2
    assert f"{source}, line 2: invalid UTF-8" in err and "byte 4 of the line" in err
    lines = out.splitlines()
    assert len(lines) == 3 and lines[1] == ""
    assert words(read_trees(lines[2])[0]) == ["It", "rose", "."]
