"""Labeled bracketing scores in the EVALB convention (Sekine and Collins, COLLINS.prm).

As EVALB with COLLINS.prm: punctuation words (POS tags , : `` '' . and -NONE-) are removed
before spans are counted, the TOP/root wrapper is not a bracket, preterminals (POS tags) are not
brackets, ADVP and PRT count as the same label, and brackets are matched as a multiset of
(label, start, end). Precision and recall are summed over the corpus (not averaged per
sentence); exact match counts sentences whose bracket multisets are equal.
"""

import collections

from pipelines.treebank import Tree, is_preterminal

PUNCTUATION_TAGS = {",", ":", "``", "''", ".", "-NONE-"}
ROOT_LABELS = {"TOP", "ROOT", ""}
EQUIVALENT = {"PRT": "ADVP"}


def brackets(tree):
    """Counter of (label, start, end) over non-punctuation word positions."""
    if tree.label in ROOT_LABELS and len(tree.children) == 1 and isinstance(tree.children[0], Tree):
        tree = tree.children[0]
    result = collections.Counter()

    def walk(node, start):
        if is_preterminal(node):
            return start + (0 if node.label in PUNCTUATION_TAGS else 1)
        end = start
        for child in node.children:
            end = walk(child, end) if isinstance(child, Tree) else end + 1
        if end > start and node.label not in ROOT_LABELS:
            label = EQUIVALENT.get(node.label, node.label)
            result[(label, start, end)] += 1
        return end

    walk(tree, 0)
    return result


def score(gold_trees, predicted_trees):
    """{"precision", "recall", "f1", "exact_match" (percentages), "sentences", "matched",
    "gold", "predicted"} over paired trees."""
    if len(gold_trees) != len(predicted_trees):
        raise ValueError(f"{len(gold_trees)} gold trees but {len(predicted_trees)} predicted.")
    matched = gold_total = predicted_total = exact = 0
    for gold, predicted in zip(gold_trees, predicted_trees):
        g, p = brackets(gold), brackets(predicted)
        common = sum((g & p).values())
        matched += common
        gold_total += sum(g.values())
        predicted_total += sum(p.values())
        exact += int(g == p)
    precision = 100.0 * matched / predicted_total if predicted_total else 0.0
    recall = 100.0 * matched / gold_total if gold_total else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    sentences = len(gold_trees)
    return {"precision": round(precision, 2), "recall": round(recall, 2), "f1": round(f1, 2),
            "exact_match": round(100.0 * exact / sentences, 2) if sentences else 0.0,
            "sentences": sentences, "matched": matched, "gold": gold_total,
            "predicted": predicted_total}
