"""Terminology on the command line: `translate --constraints` (source<TAB>phrase... lines),
`--glossary FILE.tsv` and both together; the refusals (decoding/jobs/terminology.py)."""

import pytest

from keras_transformer import cli
from keras_transformer.decoding.jobs.terminology import Glossary, merged, split_line
from keras_transformer.errors import InputError


def write(path, lines, encoding="utf-8"):
    path.write_bytes(b"".join((line if isinstance(line, bytes) else line.encode(encoding))
                              + b"\n" for line in lines))
    return str(path)


def test_a_line_splits_into_its_source_and_phrases():
    assert split_line("a dog\tDOG\tTHE PARK") == ("a dog", ["DOG", "THE PARK"])
    assert split_line("a dog") == ("a dog", [])
    assert split_line("a dog\t  DOG   RUNS ") == ("a dog", ["DOG RUNS"])
    for line in ("a dog\t\tDOG", "a dog\tDOG\t", "a dog\t "):
        with pytest.raises(InputError, match="^in.txt line 3: an empty constraint phrase"):
            split_line(line, "in.txt line 3")
    assert merged(["A", "B"], ["B", "C"]) == ["A", "B", "C"]


def test_a_glossary_matches_whole_words_and_is_checked(tmp_path):
    glossary = Glossary.read(write(tmp_path / "g.tsv", ["dog\tHUND", "", "red cat\tROTE KATZE",
                                                        "park\tPARK"]))
    assert glossary.targets("the dog sees a red cat in the park.") == ["HUND", "ROTE KATZE",
                                                                       "PARK"]
    assert glossary.targets("the dogs and a redcat") == []  # whole words only
    assert glossary.targets("The Dog") == []
    loose = Glossary.read(str(tmp_path / "g.tsv"), ignore_case=True)
    assert loose.targets("The Dog") == ["HUND"]
    for lines, message in (
            (["dog HUND"], r"g2.tsv line 1: a glossary line is 'source term<TAB>target term'"),
            (["dog\tHUND", "cat\t"], "g2.tsv line 2: a glossary line"),
            (["dog\tHUND\textra"], "g2.tsv line 1"),
            ([b"dog\tH\xfcND"], r"g2.tsv, line 1: invalid UTF-8 .*a glossary must be UTF-8"),
            ([""], "g2.tsv holds no terms")):
        with pytest.raises(InputError, match=message):
            Glossary.read(write(tmp_path / "g2.tsv", lines))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("terminology")
    return {
        "plain": write(folder / "plain.txt", ["the dog runs in the park", "a big red cat", "",
                                              "green water"]),
        "constrained": write(folder / "constrained.txt", [
            "the dog runs in the park\tPARK\tDOG", "a big red cat", "", "green water\tGREEN"]),
        "glossary": write(folder / "glossary.tsv", ["cat\tCAT", "water\tWATER"]),
        "folder": folder,
    }


def translate(tiny_run, *flags):
    precision = [] if "--engine" in flags else ["--precision", "float32"]
    return cli.main(["translate", "--run-dir", str(tiny_run), *precision, *flags])


@pytest.mark.slow  # three translate commands, each compiling its search (13 s of make test-fast)
def test_constraints_and_a_glossary_appear_in_the_translations(tiny_run, inputs, capsys):
    folder = inputs["folder"]
    assert translate(tiny_run, "--input", inputs["plain"], "--output",
                     str(folder / "plain.out")) == 0
    assert translate(tiny_run, "--constraints", "--glossary", inputs["glossary"], "--input",
                     inputs["constrained"], "--output", str(folder / "both.out")) == 0
    err = capsys.readouterr().err
    assert "constraints True [flag]" in err and "glossary " in err
    plain = (folder / "plain.out").read_text(encoding="utf-8").splitlines()
    both = (folder / "both.out").read_text(encoding="utf-8").splitlines()
    assert len(both) == 4 and both[2] == ""  # one line per input line, the empty one empty
    wanted = [["PARK", "DOG"], ["CAT"], [], ["GREEN", "WATER"]]
    for text, phrases in zip(both, wanted):
        assert all(phrase in text for phrase in phrases), (text, phrases)
    # An unconstrained line of the constrained file is translated as without constraints.
    assert both[1] != plain[1] or "CAT" in plain[1]
    # n-best and alignments with constraints: every hypothesis holds the phrases.
    assert translate(tiny_run, "--constraints", "--nbest", "--alignments", "--input",
                     inputs["constrained"], "--output", str(folder / "nbest.out")) == 0
    rows = [line.split("\t") for line in
            (folder / "nbest.out").read_text(encoding="utf-8").splitlines()]
    assert {row[0] for row in rows} == {"0", "1", "2", "3"} or {row[0] for row in rows} == {
        "0", "1", "3"}
    for row in rows:
        phrases = {"0": ["PARK", "DOG"], "3": ["GREEN"]}.get(row[0], [])
        assert all(phrase in row[2] for phrase in phrases), row
        assert len(row) == 4  # line, score, text, alignment


@pytest.mark.parametrize("flags, message", [
    (["--constraints", "--sample"], "--constraints is for beam search, not --sample"),
    (["--constraints", "--beam", "1"], "constraints need beam search: use a beam of 2 or more"),
    (["--glossary", "G", "--engine", "ctranslate2", "--ctranslate2-model", "."],
     "the ctranslate2 engine does not support constraints yet; the tensorflow engine does"),
])
def test_what_constraints_cannot_do_is_refused_clearly(tiny_run, inputs, capsys, flags, message):
    flags = [inputs["glossary"] if flag == "G" else flag for flag in flags]
    assert translate(tiny_run, *flags, "--input", inputs["constrained"]) == 2
    assert message in capsys.readouterr().err


def test_an_empty_phrase_is_refused_naming_the_line(tiny_run, inputs, capsys):
    bad = write(inputs["folder"] / "bad.txt", ["a dog\tDOG", "a cat\t\tCAT"])
    assert translate(tiny_run, "--constraints", "--input", bad, "--output",
                     str(inputs["folder"] / "bad.out")) == 2
    assert f"{bad} line 2: an empty constraint phrase" in capsys.readouterr().err
