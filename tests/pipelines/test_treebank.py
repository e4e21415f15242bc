import pytest

from pipelines.treebank import (Tree, TreeError, clean, delinearize, linearize, read_trees,
                                sample_splits, to_string)

MRG = """
( (S (NP-SBJ-1 (NNP Pierre) (NNP Vinken))
     (VP (MD will) (VP (VB join) (NP (DT the) (NN board))
         (S (NP-SBJ (-NONE- *-1)) (VP (TO to) (VP (VB go))))))
     (. .)))
( (S (NP-SBJ=2 (PRP It)) (VP (VBZ is)) (. .)))
"""


def test_read_and_clean_strip_function_tags_and_empty_elements():
    trees = [clean(t) for t in read_trees(MRG)]
    assert len(trees) == 2
    assert to_string(trees[0]) == (
        "(TOP (S (NP (NNP Pierre) (NNP Vinken)) (VP (MD will) (VP (VB join) (NP (DT the) "
        "(NN board)) (S (VP (TO to) (VP (VB go)))))) (. .)))")
    assert to_string(trees[1]) == "(TOP (S (NP (PRP It)) (VP (VBZ is)) (. .)))"


def test_linearize_is_vinyals_style():
    tree = clean(read_trees(MRG)[1])
    words, tokens = linearize(tree, with_words=False)
    assert words == ["It", "is", "."]
    assert tokens == ["(S", "(NP", "PRP", ")NP", "(VP", "VBZ", ")VP", ".", ")S"]
    assert linearize(tree)[1] == ["(S", "(NP", "PRP", "It", ")NP", "(VP", "VBZ", "is", ")VP",
                                  ".", ".", ")S"]


def test_malformed_text_is_named():
    with pytest.raises(TreeError, match="wsj_x.mrg: 2 unclosed"):
        read_trees("( (S (NN a)", source="wsj_x.mrg")
    with pytest.raises(TreeError, match="unbalanced"):
        read_trees("(S (NN a)))")


@pytest.mark.parametrize("with_words", [pytest.param(True, marks=pytest.mark.slow), False])
def test_round_trip_over_every_sample_tree(shared_data, with_words):
    splits = sample_splits(shared_data / "ptb-sample" / "treebank-combined.tar.gz")
    counts = {name: len(trees) for name, trees in splits.items()}
    assert sum(counts.values()) > 3800 and min(counts.values()) > 100, counts
    for trees in splits.values():
        for tree in trees:
            words, tokens = linearize(tree, with_words)
            expected = tree.children[0] if tree.label == "TOP" else tree
            assert delinearize(tokens, words, with_words) == expected, to_string(tree)


@pytest.mark.parametrize("tokens, words, expected", [
    # constituents left open are closed
    ("(S (NP DT NN )NP (VP VBZ", "The dog runs",
     "(S (NP (DT The) (NN dog)) (VP (VBZ runs)))"),
    # a close bracket with nothing open is dropped; labels of closes are not trusted
    (")S (S (NP NN )VP )S )S", "x", "(S (NP (NN x)))"),
    # words without a tag get XX in the innermost open constituent (the root here)
    ("(S (NP DT )NP )S", "The dog", "(S (NP (DT The)) (XX dog))"),
    # tags beyond the words are dropped, and a constituent left empty with them
    ("(S DT NN (VP VBZ )VP )S", "The dog", "(S (DT The) (NN dog))"),
    # nothing usable at all
    ("", "a b", "(S (XX a) (XX b))"),
    # tags before any bracket get an S root
    ("NN (VP VBZ )VP", "dog runs", "(S (NN dog) (VP (VBZ runs)))"),
])
def test_repair_of_malformed_output(tokens, words, expected):
    assert to_string(delinearize(tokens.split(), words.split(), with_words=False)) == expected


@pytest.mark.parametrize("tokens, words, expected", [
    # the copied words are skipped; the tree's words are the sentence's
    ("(S (NP DT The NN cat )NP (VP VBZ runs )VP )S", "The dog runs",
     "(S (NP (DT The) (NN dog)) (VP (VBZ runs)))"),
    # a rare word copied in pieces, with a tag in the middle: aligned by the copied words,
    # the extra leaf dropped
    ("(S (NP NNP Interleuk NNP cin-3 NNS materials )NP (VP VBZ covers )VP )S",
     "Interleukin-3 materials covers",
     "(S (NP (NNP Interleukin-3) (NNS materials)) (VP (VBZ covers)))"),
    # a skipped word gets an XX leaf where it belongs, not at the end
    ("(S (NP DT The )NP (VP VBZ runs )VP )S", "The dog runs",
     "(S (NP (DT The)) (VP (XX dog) (VBZ runs)))"),
    # a punctuation word equal to its tag
    ("(S (NP NN dog )NP . . )S", "dog .", "(S (NP (NN dog)) (. .))"),
    # unclosed, and words left over
    ("(S (NP DT The", "The dog", "(S (NP (DT The) (XX dog)))"),
])
def test_repair_of_malformed_output_with_words(tokens, words, expected):
    assert to_string(delinearize(tokens.split(), words.split())) == expected
