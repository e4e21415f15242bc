import pytest

from keras_transformer.tasks.evalb import brackets, score
from pipelines.treebank import read_trees

GOLD = "( (S (NP (DT The) (NN dog)) (VP (VBZ runs) (ADVP (RB fast))) (. .)))"


def tree(text):
    return read_trees(text)[0]


def test_brackets_ignore_root_preterminals_and_punctuation():
    assert brackets(tree(GOLD)) == {("S", 0, 4): 1, ("NP", 0, 2): 1, ("VP", 2, 4): 1,
                                    ("ADVP", 3, 4): 1}
    # Leading punctuation does not shift spans; PRT counts as ADVP.
    quoted = tree("(S (`` ``) (NP (NN x)) (PRT (RP up)) (, ,))")
    assert brackets(quoted) == {("S", 0, 2): 1, ("NP", 0, 1): 1, ("ADVP", 1, 2): 1}


def test_hand_computed_scores():
    predicted = tree("( (S (NP (DT The)) (VP (NN dog) (VBZ runs) (PRT (RB fast))) (. .)))")
    # gold S(0,4) NP(0,2) VP(2,4) ADVP(3,4); predicted S(0,4) NP(0,1) VP(1,4) ADVP(3,4):
    # 2 of 4 match in each direction.
    result = score([tree(GOLD)], [predicted])
    assert (result["precision"], result["recall"], result["f1"]) == (50.0, 50.0, 50.0)
    assert result["exact_match"] == 0.0
    # Corpus totals, not per-sentence averages: 2 + 4 matched of 4 + 4 gold, 4 + 4 predicted;
    # one of two sentences exact.
    flat = tree("( (S (DT The) (NN dog) (VBZ runs) (RB fast) (. .)))")  # 1 bracket: S(0,4)
    result = score([tree(GOLD), tree(GOLD), tree(GOLD)], [predicted, tree(GOLD), flat])
    assert result["matched"] == 2 + 4 + 1 and result["gold"] == 12 and result["predicted"] == 9
    assert result["precision"] == pytest.approx(100 * 7 / 9, abs=0.01)
    assert result["recall"] == pytest.approx(100 * 7 / 12, abs=0.01)
    assert result["exact_match"] == pytest.approx(33.33, abs=0.01)


def test_duplicate_brackets_count_as_a_multiset():
    gold = tree("(S (NP (NP (NN x))) (VP (VB y)))")  # NP(0,1) twice
    once = tree("(S (NP (NN x)) (VP (VB y)))")
    result = score([gold], [once])
    assert result["matched"] == 3 and result["gold"] == 4 and result["predicted"] == 3


def test_mismatched_lengths_are_an_error():
    with pytest.raises(ValueError, match="1 gold trees but 0 predicted"):
        score([tree(GOLD)], [])
