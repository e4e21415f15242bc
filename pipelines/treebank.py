"""Penn Treebank trees for constituency parsing as translation (paper Section 6.3).

Trees are `Tree(label, children)` where a child is a `Tree` or a word (str); a preterminal is a
tree whose only child is a word. The pipeline:

    read_trees(text)        bracketed .mrg text -> trees (the unlabeled outer bracket -> "TOP")
    clean(tree)             function tags and co-indices stripped (NP-SBJ-1 -> NP), empty
                            elements (-NONE-) and the constituents left empty by them removed
    linearize(tree)         -> (words, tokens): the sentence, and the tree as a token sequence
                            in the style of Vinyals et al. (2015), "Grammar as a Foreign
                            Language": "(S (NP NNP NNP )NP (VP VBZ ... )VP . )S" - an opening
                            bracket with its label, POS tags in place of the words, a closing
                            bracket with its label
    delinearize(tokens, words)  the inverse, repairing malformed sequences deterministically

`sample_splits` reads the NLTK 10% WSJ sample and splits it by file (`SPLITS`: files 1-179
train, 180-189 dev, 190-199 test).
"""

import collections
import difflib
import functools
import os
import pathlib
import re
import tarfile

from pipelines.errors import DataError

Tree = collections.namedtuple("Tree", ["label", "children"])

SPLITS = {"train": (1, 179), "dev": (180, 189), "test": (190, 199)}
REPAIR_TAG = "XX"  # POS tag given to words the model produced no tag for
# The Penn Treebank POS tags (Santorini 1990), for telling a tag from a piece of a copied word.
PTB_TAGS = frozenset(
    "CC CD DT EX FW IN JJ JJR JJS LS MD NN NNS NNP NNPS PDT POS PRP PRP$ RB RBR RBS RP SYM TO UH "
    "VB VBD VBG VBN VBP VBZ WDT WP WP$ WRB # $ . , : `` '' -LRB- -RRB- -NONE-".split()
)


class TreeError(DataError):
    """Malformed bracketed text (names the source and position)."""


def _tokens(text):
    return re.findall(r"\(|\)|[^\s()]+", text)


def read_trees(text, source="<text>"):
    """Parses every top-level bracketed tree in `text`."""
    tokens, trees, stack = _tokens(text), [], []
    for position, token in enumerate(tokens):
        if token == "(":
            label = tokens[position + 1] if position + 1 < len(tokens) else ")"
            stack.append(Tree(label if label not in "()" else "TOP", []))
        elif token == ")":
            if not stack:
                raise TreeError(f"{source}: unbalanced ')' at token {position + 1}")
            tree = stack.pop()
            if stack:
                stack[-1].children.append(tree)
            else:
                trees.append(tree)
        else:
            if not stack:
                raise TreeError(f"{source}: word {token!r} outside a tree at token {position + 1}")
            if tokens[position - 1] == "(":
                continue  # the label, already used
            stack[-1].children.append(token)
    if stack:
        raise TreeError(f"{source}: {len(stack)} unclosed '(' at the end")
    return trees


def strip_label(label):
    """NP-SBJ-1 -> NP, NP=2 -> NP; -NONE-, -LRB- and -RRB- are kept."""
    if label.startswith("-") and label.endswith("-"):
        return label
    return re.split(r"[-=]", label)[0] or label


def clean(tree):
    """Tree without function tags and empty elements; None if nothing is left."""
    if isinstance(tree, str):
        return tree
    if tree.label == "-NONE-":
        return None
    children = [c for c in (clean(child) for child in tree.children) if c is not None]
    if not children:
        return None
    return Tree(strip_label(tree.label), children)


def words(tree):
    if isinstance(tree, str):
        return [tree]
    return [w for child in tree.children for w in words(child)]


def is_preterminal(tree):
    return len(tree.children) == 1 and isinstance(tree.children[0], str)


def linearize(tree, with_words=True):
    """(words, tokens) of a cleaned tree; the TOP wrapper is left out.

    With `with_words` (the default, what the parser is trained on) each POS tag is followed by
    its word: "(S (NP NNP Pierre NNP Vinken )NP ...". The copied words tell the decoder where it
    is in the sentence, which a model trained on a few thousand trees otherwise has to learn by
    counting; without them the sequence is Vinyals et al.'s "(S (NP NNP NNP )NP ...".
    """
    if tree.label == "TOP" and len(tree.children) == 1:
        tree = tree.children[0]
    tokens = []

    def walk(node):
        if is_preterminal(node):
            tokens.append(node.label)
            if with_words:
                tokens.append(node.children[0])
            return
        tokens.append("(" + node.label)
        for child in node.children:
            walk(child)
        tokens.append(")" + node.label)

    walk(tree)
    return words(tree), tokens


def _is_bracket(token):
    return (token.startswith("(") or token.startswith(")")) and len(token) > 1


def align_leaves(tokens, sentence):
    """Tags-only tokens from a with-words sequence, its leaves aligned to `sentence`'s words.

    The token after a tag is its copied word; further tokens that are not PTB tags are more
    pieces of that word (a rare word copied in pieces). When the leaves and the words differ in
    number, a minimum-cost alignment (edit distance; substituting costs 1 - the similarity of
    the two strings) decides which leaf holds which word: a leaf left without a word is dropped,
    a word left without a leaf gets an XX leaf where the next aligned leaf stands. With as many
    leaves as words, leaf i is word i.
    """
    items, leaves, expecting_word = [], [], False  # items: brackets and leaf indices
    for token in tokens:
        if _is_bracket(token):
            items.append(token)
            expecting_word = False
        elif expecting_word:
            leaves[-1][1] = token
            expecting_word = False
        elif items and isinstance(items[-1], int) and token not in PTB_TAGS:
            leaves[-1][1] += token  # another piece of the same word
        else:
            items.append(len(leaves))
            leaves.append([token, ""])
            expecting_word = True
    if len(leaves) == len(sentence):
        word_of = list(range(len(leaves)))
    else:
        word_of = _align([copied for _, copied in leaves], sentence)
    output, next_word = [], 0
    for item in items:
        if isinstance(item, str):
            output.append(item)
            continue
        index = word_of[item]
        if index is None:
            continue  # a leaf with no word of its own
        output.extend([REPAIR_TAG] * (index - next_word))  # words the model skipped
        output.append(leaves[item][0])
        next_word = index + 1
    return output


def _align(copied, sentence):
    """For each copied word, the index of its sentence word (or None), by minimum edit cost."""
    n, m = len(copied), len(sentence)
    substitute = [[0.0 if a == b else 1.0 - difflib.SequenceMatcher(None, a, b).ratio()
                   for b in sentence] for a in copied]
    cost = [[float(i + j) if i == 0 or j == 0 else 0.0 for j in range(m + 1)]
            for i in range(n + 1)]
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            cost[i][j] = min(cost[i - 1][j - 1] + substitute[i - 1][j - 1],
                             cost[i - 1][j] + 1.0, cost[i][j - 1] + 1.0)
    word_of, i, j = [None] * n, n, m
    while i > 0 and j > 0:
        if cost[i][j] == cost[i - 1][j - 1] + substitute[i - 1][j - 1]:
            word_of[i - 1] = j - 1
            i, j = i - 1, j - 1
        elif cost[i][j] == cost[i - 1][j] + 1.0:
            i -= 1
        else:
            j -= 1
    return word_of


def delinearize(tokens, sentence, with_words=True):
    """A tree over `sentence` (list of words) from a token sequence, repaired if malformed.

    The tree's words are always those of `sentence`, in order. With `with_words`, the leaves
    are first aligned to the words by their copied words (`align_leaves`).

    Repairs, all deterministic: a closing bracket closes the innermost open constituent whatever
    its label; closing brackets with nothing open are dropped; constituents still open at the
    end are closed; POS tags beyond the number of words are dropped; words left without a POS
    tag get the tag XX in the innermost constituent still open at the end (or the root); an
    output with no constituent at all gets an S root; a constituent left empty is dropped.
    """
    if with_words:
        tokens = align_leaves(tokens, sentence)
    root = None
    stack = []
    position = 0
    for token in tokens:
        if token.startswith("(") and len(token) > 1:
            node = Tree(token[1:], [])
            if stack:
                stack[-1].children.append(node)
            elif root is None:
                root = node
            else:  # a second top-level tree: continue inside the first one
                root.children.append(node)
            stack.append(node)
        elif token.startswith(")"):
            if stack:
                stack.pop()
        else:
            if position >= len(sentence):
                continue
            leaf = Tree(token, [sentence[position]])
            position += 1
            if stack:
                stack[-1].children.append(leaf)
            elif root is None:
                root = Tree("S", [leaf])
                stack.append(root)
            else:
                root.children.append(leaf)
    if root is None:
        root = Tree("S", [])
    target = stack[-1] if stack else root
    for word in sentence[position:]:
        target.children.append(Tree(REPAIR_TAG, [word]))
    return _drop_empty(root) or Tree("S", [])


def _drop_empty(tree):
    if isinstance(tree, str) or is_preterminal(tree):
        return tree
    children = [c for c in (_drop_empty(child) for child in tree.children) if c is not None]
    return Tree(tree.label, children) if children else None


def to_string(tree):
    """One-line bracketed form: (S (NP (DT The) (NN dog)) (VP (VBZ runs)))."""
    if isinstance(tree, str):
        return tree
    return "(" + tree.label + " " + " ".join(to_string(child) for child in tree.children) + ")"


def default_ptb_archive(folder=None):
    """The WSJ sample archive: FOLDER, $PTB_SAMPLE_DIR or ../shared/data/ptb-sample."""
    candidates = [folder, os.environ.get("PTB_SAMPLE_DIR"),
                  pathlib.Path.cwd().parent / "shared/data/ptb-sample",
                  pathlib.Path(__file__).resolve().parents[2] / "shared/data/ptb-sample"]
    for candidate in candidates:
        if candidate and (pathlib.Path(candidate) / "treebank-combined.tar.gz").is_file():
            return pathlib.Path(candidate) / "treebank-combined.tar.gz"
    raise DataError(
        "treebank-combined.tar.gz not found (looked in the source_dir given, $PTB_SAMPLE_DIR and "
        "../shared/data/ptb-sample); NLTK distributes it as corpora/treebank.zip in nltk_data.")


def tree_symbols(trees):
    """Every bracket and POS token of the linearized trees, sorted (one vocabulary piece each)."""
    symbols = set()
    for tree in trees:
        symbols.update(linearize(tree, with_words=False)[1])
    return sorted(symbols)


def task_pairs(trees):
    """(sentences, linearized trees) as space-joined strings: the parsing 'translation' pairs."""
    sources, targets = [], []
    for tree in trees:
        sentence, tokens = linearize(tree)
        sources.append(" ".join(sentence))
        targets.append(" ".join(tokens))
    return sources, targets


@functools.lru_cache(maxsize=4)
def sample_splits(archive):
    """{"train"|"dev"|"test": [cleaned trees]} from the NLTK WSJ sample archive, split by file
    number (train 0001-0179, dev 0180-0189, test 0190-0199)."""
    splits = {name: [] for name in SPLITS}
    with tarfile.open(archive) as tar:
        members = sorted((m for m in tar.getmembers() if m.name.endswith(".mrg")),
                         key=lambda m: m.name)
        if not members:
            raise TreeError(f"{archive}: no .mrg files inside")
        for member in members:
            match = re.search(r"wsj_(\d{4})\.mrg$", member.name)
            if not match:
                continue
            number = int(match.group(1))
            split = next((name for name, (low, high) in SPLITS.items()
                          if low <= number <= high), None)
            if split is None:
                continue
            text = tar.extractfile(member).read().decode("utf-8")
            for tree in read_trees(text, source=member.name):
                tree = clean(tree)
                if tree is not None:
                    splits[split].append(tree)
    return splits
