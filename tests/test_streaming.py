"""Inputs of any size: windows decoded in input order, a resumable output, a translate killed
half-way and run again."""

import json
import pathlib
import random
import sys

import pytest

from keras_transformer.errors import InputError
from tests.conftest import RUNTIME_CLI
from tests.training_helpers import WORDS, kill_once_exists

REPOSITORY = pathlib.Path(__file__).resolve().parents[1]


def write_sentences(path, count, seed=3):
    rng = random.Random(seed)
    lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(count)]
    lines[5] = ""  # an empty line gives an empty line
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return lines


def test_stream_lines_keeps_input_order_and_checks_alignment(tmp_path):
    from keras_transformer.decoding.jobs.streaming import stream_lines

    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("one\ntwo\nthree\nfour\nfive", encoding="utf-8")  # no final newline
    second.write_text("1\n2\n3\n4\n5\n", encoding="utf-8")
    calls = []

    def decode_rows(rows, numbers, progress):
        calls.append(numbers)
        return [[f"{i} {a} {b}"] for i, (a, b) in zip(numbers, rows)]

    output = tmp_path / "out.txt"
    assert stream_lines(decode_rows, [str(first), str(second)], output, window=2) == 5
    assert output.read_text(encoding="utf-8").split("\n")[:-1] == [
        "0 one 1", "1 two 2", "2 three 3", "3 four 4", "4 five 5"]
    assert calls == [[0, 1], [2, 3], [4]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt", "out.txt"]
    second.write_text("1\n2\n3\n", encoding="utf-8")
    with pytest.raises(InputError, match=f"{second} has 3 lines but {first} has 5: .*aligned"):
        stream_lines(decode_rows, [str(first), str(second)], tmp_path / "x.txt", window=2)


def test_a_partial_output_is_continued_only_by_the_same_job(tmp_path):
    from keras_transformer.decoding.jobs.resumable import ResumableOutput

    path = tmp_path / "out.txt"
    output = ResumableOutput(path, {"beam": 4})
    assert output.done == 0 and output.resumed is None
    output.write(2, ["a", "b"])
    output.write(1, ["c"])
    output._handle.write(b"half a wind")  # killed while writing the next window
    output.close()
    again = ResumableOutput(path, {"beam": 4})
    assert again.done == 3 and "after the 3 input lines already done" in again.resumed
    again.write(1, ["d"])
    again.finish()
    assert path.read_text(encoding="utf-8") == "a\nb\nc\nd\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    output = ResumableOutput(path, {"beam": 4})
    output.write(2, ["x", "y"])
    output.close()
    other = ResumableOutput(path, {"beam": 5})  # other options: from the start
    assert other.done == 0 and "another input or other options" in other.resumed
    other.finish()
    assert path.read_text(encoding="utf-8") == ""


@pytest.mark.slow  # a child process that imports TensorFlow
def test_a_translate_killed_half_way_and_run_again_writes_the_whole_output(
        tiny_run, tmp_path, capsys, graph_optimizer_on):  # this process's lines as the child's
    from keras_transformer import cli

    source = tmp_path / "in.txt"
    lines = write_sentences(source, 300)
    flags = ["translate", "--run-dir", str(tiny_run), "--input", str(source), "--beam", "1",
             "--batch-size", "16", "--precision", "float32"]  # windows of 256 lines
    whole = tmp_path / "whole.txt"
    assert cli.main([*flags, "--output", str(whole)]) == 0
    assert len(whole.read_text(encoding="utf-8").split("\n")) == len(lines) + 1

    output = tmp_path / "out.txt"
    record = tmp_path / "out.txt.partial.json"
    error = kill_once_exists([sys.executable, *RUNTIME_CLI, *flags, "--output", str(output)],
                             record, cwd=REPOSITORY)
    assert record.exists(), f"the translate ended before its first window: {error[-2000:]}"
    done = json.loads(record.read_text(encoding="utf-8"))["lines"]
    assert 0 < done < len(lines) and not output.exists()

    capsys.readouterr()
    assert cli.main([*flags, "--output", str(output)]) == 0
    assert f"after the {done} input lines already done" in capsys.readouterr().err
    assert output.read_bytes() == whole.read_bytes()
    assert not record.exists() and not (tmp_path / "out.txt.partial").exists()


def test_evaluate_split_translates_a_window_at_a_time_from_an_iterator(tmp_path):
    from keras_transformer.evaluation.evaluate import evaluate_split

    class Echo:
        batch_size, calls = 1, []

        def translate(self, texts, progress=None):
            self.calls.append(len(texts))
            return list(texts)

    lines = [f"Der Hund {i} läuft durch den Park." for i in range(40)]
    output = tmp_path / "hyp.txt"
    result = evaluate_split(Echo(), iter(lines), lines, lang="de", output=output,
                            progress=False)
    assert Echo.calls == [16, 16, 8]  # windows of 16 batches of 1
    assert output.read_text(encoding="utf-8") == "".join(line + "\n" for line in lines)
    assert result["sacrebleu"] == 100.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hyp.txt"]


def test_empty_inputs_give_empty_outputs(tiny_run, tmp_path, capsys, monkeypatch):
    """translate and score of empty files: an empty output file (0 lines), exit status 0, no
    resumable record left; to standard output: nothing."""
    import io

    from keras_transformer import cli

    source, target = tmp_path / "src.txt", tmp_path / "tgt.txt"
    source.write_bytes(b"")
    target.write_bytes(b"")
    run = ["--run-dir", str(tiny_run), "--precision", "float32"]
    translations, scores = tmp_path / "hyp.txt", tmp_path / "scores.txt"
    assert cli.main(["translate", *run, "--input", str(source), "--output",
                     str(translations)]) == 0
    assert f"wrote 0 translations to {translations}" in capsys.readouterr().err
    assert cli.main(["score", *run, "--src", str(source), "--tgt", str(target), "--output",
                     str(scores)]) == 0
    assert f"wrote the scores of 0 pairs to {scores}" in capsys.readouterr().err
    assert translations.read_bytes() == scores.read_bytes() == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "hyp.txt", "scores.txt", "src.txt", "tgt.txt"]

    assert cli.main(["score", *run, "--src", str(source), "--tgt", str(target)]) == 0
    assert capsys.readouterr().out == ""

    class Stdin:  # an empty pipe
        buffer = io.BytesIO(b"")

        @staticmethod
        def isatty():
            return False

    monkeypatch.setattr("sys.stdin", Stdin())
    assert cli.main(["translate", *run]) == 0
    assert capsys.readouterr().out == ""
