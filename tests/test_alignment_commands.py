"""Word alignments through the commands (`translate`, `score`, `evaluate`, `export`
--alignments) and the engines' Python API, on the tiny run: the Pharaoh format (text TAB
links, every index within the word counts of its input and output lines, an empty line gives
an empty alignment), the JSON field, the file beside the hypotheses, the option in the
resumable job's identity, and what is refused."""

import json

import pytest

from keras_transformer import cli
from keras_transformer.decoding.search.alignment import parse_pharaoh
from keras_transformer.export import ExportError, export_run
from tests.conftest import run_decoder, run_engine

LINES = ["the dog runs in the park", "", "a big red cat", "green   water ", "a"]
TARGETS = ["PARK THE IN RUNS DOG THE", "", "CAT RED BIG A", "WATER GREEN", ""]


def assert_within(line, source, target):
    """`line` links every word of `target` once, to a word of `source`, in target order."""
    sure, _ = parse_pharaoh(line)
    assert "-".join(line.split()) == "-".join(sorted(line.split(),
                                                     key=lambda p: int(p.split("-")[1])))
    if not source.split():
        assert line == ""
        return
    assert sorted(t for _, t in sure) == list(range(len(target.split()))), (line, target)
    assert all(0 <= s < len(source.split()) for s, _ in sure), (line, source)


@pytest.mark.slow
def test_translate_alignments_lines_are_text_tab_pharaoh(tiny_run, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    output = tmp_path / "out.txt"
    assert cli.main(["translate", "--run-dir", str(tiny_run), "--input", str(source),
                     "--output", str(output), "--alignments", "--precision", "float32"]) == 0
    assert "alignments True [flag]" in capsys.readouterr().err
    lines = output.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(LINES)
    for line, text in zip(lines, LINES):
        translation, links = line.split("\t")  # exactly one tab
        assert_within(links, text, translation)
    assert lines[1] == "\t"  # an empty line: empty translation, empty alignment
    # The option is part of the resumable job's identity: without it, the job starts over.
    assert cli.main(["translate", "--run-dir", str(tiny_run), "--input", str(source),
                     "--output", str(output), "--precision", "float32"]) == 0
    assert "\t" not in output.read_text(encoding="utf-8")
    # The Python API says the same; the plain translations are unchanged.
    translator = run_engine(tiny_run, precision="float32")
    pairs = translator.translate(LINES, alignments=True)
    assert ["\t".join(pair) for pair in pairs] == lines
    assert [text for text, _ in pairs] == translator.translate(LINES)
    # n-best: line, score, text, alignment; every hypothesis aligned.
    assert cli.main(["translate", "--run-dir", str(tiny_run), "--input", str(source),
                     "--nbest", "--beam", "2", "--alignments", "--precision", "float32"]) == 0
    rows = [row.split("\t") for row in capsys.readouterr().out.splitlines()]
    # Two hypotheses per line, one for the empty line (no search).
    assert {len(row) for row in rows} == {4} and len(rows) == 2 * (len(LINES) - 1) + 1
    for number, _, text, links in rows:
        assert_within(links, LINES[int(number)], text)


def test_score_alignments_are_teacher_forced_on_the_given_pair(tiny_run, tmp_path, capsys):
    src, tgt = tmp_path / "src.txt", tmp_path / "tgt.txt"
    src.write_text("\n".join(LINES) + "\n", encoding="utf-8")
    tgt.write_text("\n".join(TARGETS) + "\n", encoding="utf-8")
    assert cli.main(["score", "--run-dir", str(tiny_run), "--src", str(src), "--tgt",
                     str(tgt), "--alignments", "--precision", "float32"]) == 0
    rows = [row.split("\t") for row in capsys.readouterr().out.splitlines()]
    assert [len(row) for row in rows] == [4] * len(LINES)
    for (_, _, _, links), source, target in zip(rows, LINES, TARGETS):
        assert_within(links, source, target)
    assert rows[4][3] == ""  # an empty target has no word to link
    assert cli.main(["score", "--run-dir", str(tiny_run), "--src", str(src), "--tgt",
                     str(tgt), "--alignments", "--json", "--precision", "float32"]) == 0
    found = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [f["alignment"] for f in found] == [row[3] for row in rows]
    # The JSON's log_prob is rounded to 6 decimals, the text's to 4: the same number.
    assert [f["log_prob"] for f in found] == pytest.approx([float(row[0]) for row in rows],
                                                           abs=5.01e-5)


@pytest.mark.slow  # seconds: one more model load and search (the format is tested above)
def test_evaluate_writes_the_alignments_beside_the_hypotheses(tiny_run, tmp_path, capsys):
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("\n".join(LINES[:3]) + "\n", encoding="utf-8")
    ref.write_text("\n".join(TARGETS[:3]) + "\n", encoding="utf-8")
    hypotheses = tmp_path / "hyp.txt"
    assert cli.main(["evaluate", "--run-dir", str(tiny_run), "--src", str(src), "--ref",
                     str(ref), "--output", str(hypotheses), "--alignments",
                     "--precision", "float32"]) == 0
    aligned = tmp_path / "hyp.align.txt"
    assert f"word alignments in {aligned}" in capsys.readouterr().out
    links = aligned.read_text(encoding="utf-8").splitlines()
    texts = hypotheses.read_text(encoding="utf-8").splitlines()
    assert len(links) == len(texts) == 3
    for line, source, text in zip(links, LINES, texts):
        assert_within(line, source, text)


def test_what_alignments_do_not_apply_to_is_refused(tiny_run, tmp_path, capsys):
    assert cli.main(["translate", "--run-dir", str(tiny_run), "--sample",
                     "--alignments"]) == 2
    assert "--alignments is for beam search, not --sample" in capsys.readouterr().err
    with pytest.raises(ExportError, match="alignments apply to the SavedModel's text"):
        export_run(run_decoder(tiny_run, alignments=True), format="tflite", output_dir=tmp_path)
    with pytest.raises(ExportError, match="without --ids-only"):
        export_run(run_decoder(tiny_run, alignments=True), output_dir=tmp_path, ids_only=True)
