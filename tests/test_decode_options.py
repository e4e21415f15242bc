"""The command-line face of prefixes, sampling and scoring: translate --prefix, translate
--sample, keras-transformer score."""

import json
import math
import re

import pytest

from keras_transformer import cli


def write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("flags, message", [
    (["--top-k", "5"], "--top-k is for --sample"),
    (["--seed", "3"], "--seed is for --sample"),
    (["--sample", "--nbest"], "--nbest is for beam search, not --sample"),
    (["--sample", "--beam", "4"], "--beam is for beam search, not --sample"),
    (["--sample", "--top-k", "-1"], "--top-k -1 must be 0 .no limit. or more"),
    (["--sample", "--top-p", "0"], r"--top-p 0.0 must be in \(0, 1\]"),
    (["--sample", "--top-p", "1.5"], r"--top-p 1.5 must be in \(0, 1\]"),
    (["--sample", "--temperature", "0"], "--temperature 0.0 must be above 0"),
    (["--sample", "--num-samples", "0"], "--num-samples 0 must be at least 1"),
    (["--sample", "--seed", "-1"], r"--seed -1 must be in \[0, 2\*\*31\)"),
])
def test_sampling_flags_are_checked_before_anything_loads(tmp_path, capsys, flags, message):
    # The run directory does not exist: the flags are refused first.
    status = cli.main(["translate", "--run-dir", str(tmp_path / "no-run"), *flags])
    assert status == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert re.search(message, err), err


def test_a_prefix_file_of_another_length_is_refused_naming_both(tmp_path, capsys):
    source = write(tmp_path / "in.txt", ["a dog", "the cat", "big tree"])
    prefix = write(tmp_path / "prefix.txt", ["DOG", ""])
    status = cli.main(["translate", "--run-dir", str(tmp_path / "no-run"), "--input", source,
                       "--prefix", prefix])
    assert status == 2
    assert f"{prefix} has 2 lines but {source} has 3" in capsys.readouterr().err
    target = write(tmp_path / "tgt.txt", ["DOG A"])
    assert cli.main(["score", "--run-dir", str(tmp_path / "no-run"), "--src", source,
                     "--tgt", target]) == 2
    assert f"{target} has 1 lines but {source} has 3" in capsys.readouterr().err


def test_translate_with_prefixes_starts_each_output_with_its_prefix(tiny_run, tmp_path):
    sources = ["a dog runs", "the cat sleeps", "big red tree", "water"]
    prefixes = ["RUNS", "", "TREE RED", ""]
    flags = ["translate", "--run-dir", str(tiny_run), "--beam", "2", "--precision", "float32",
             "--input", write(tmp_path / "in.txt", sources)]
    output = tmp_path / "out.txt"
    assert cli.main([*flags, "--prefix", write(tmp_path / "p.txt", prefixes),
                     "--output", str(output)]) == 0
    lines = output.read_text(encoding="utf-8").split("\n")[:-1]
    plain = tmp_path / "plain.txt"
    assert cli.main([*flags, "--output", str(plain)]) == 0
    unprefixed = plain.read_text(encoding="utf-8").split("\n")[:-1]
    assert len(lines) == len(sources)
    assert lines[0].startswith("RUNS") and lines[2].startswith("TREE RED")
    assert [lines[1], lines[3]] == [unprefixed[1], unprefixed[3]]  # no prefix: as before


@pytest.mark.slow
def test_samples_are_listed_per_line_and_repeat_with_the_seed(tiny_run, tmp_path):
    flags = ["translate", "--run-dir", str(tiny_run), "--precision", "float32", "--input",
             write(tmp_path / "in.txt", ["a dog runs", "", "the cat"]), "--sample",
             "--num-samples", "3", "--top-k", "5", "--temperature", "1.5", "--seed", "7"]
    first, second = tmp_path / "one.txt", tmp_path / "two.txt"
    assert cli.main([*flags, "--output", str(first)]) == 0
    assert cli.main([*flags, "--output", str(second)]) == 0
    lines = first.read_text(encoding="utf-8").split("\n")[:-1]
    assert first.read_text(encoding="utf-8") == second.read_text(encoding="utf-8")
    fields = [line.split("\t") for line in lines]
    assert [f[0] for f in fields] == ["0"] * 3 + ["1"] + ["2"] * 3  # an empty line: one
    assert fields[3] == ["1", "0.0000", ""]
    assert all(float(f[1]) <= 0 for f in fields)  # log-probabilities
    single = tmp_path / "single.txt"
    assert cli.main([*flags[:-8], "--sample", "--output", str(single)]) == 0
    assert len(single.read_text(encoding="utf-8").split("\n")[:-1]) == 3  # plain lines


def test_score_prints_log_probability_tokens_and_mean(tiny_run, tmp_path, capsys):
    from keras_transformer.runs import Run

    sources = ["a dog runs", "the cat sleeps in the park"]
    targets = ["RUNS DOG A", "PARK THE IN SLEEPS CAT THE"]
    flags = ["score", "--run-dir", str(tiny_run), "--precision", "float32",
             "--src", write(tmp_path / "src.txt", sources),
             "--tgt", write(tmp_path / "tgt.txt", targets)]
    assert cli.main(flags) == 0
    rows = [line.split("\t") for line in capsys.readouterr().out.splitlines()]
    assert [len(row) for row in rows] == [3, 3]
    vocabulary = Run(tiny_run).vocabulary()
    for (total, tokens, mean), target in zip(rows, targets):
        assert int(tokens) == len(vocabulary.encode([target])[0]) + 1  # with EOS
        assert float(total) < 0 and math.isclose(float(mean), float(total) / int(tokens),
                                                 abs_tol=1e-3)
    output = tmp_path / "scores.jsonl"
    assert cli.main([*flags, "--json", "--output", str(output)]) == 0
    records = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    assert [sorted(r) for r in records] == [["log_prob", "mean", "tokens"]] * 2
    for record, (total, tokens, mean) in zip(records, rows):
        assert record["tokens"] == int(tokens)
        assert math.isclose(record["log_prob"], float(total), abs_tol=1e-4)


def test_an_engine_without_an_option_is_refused_in_one_line():
    from keras_transformer.cli.decode import require
    from keras_transformer.errors import InputError

    class OlderEngine:  # an engine's translator from before prefixes, sampling and scoring
        def translate(self, sentences, nbest=False, progress=None):
            return sentences

    engine = OlderEngine()
    require(engine, "--nbest", "ctranslate2", "translate", "nbest")
    for what, method, option in (("--prefix", "translate", "prefixes"),
                                 ("--sample", "sample", None), ("scoring", "score", None)):
        with pytest.raises(InputError, match=f"^--engine ctranslate2 does not support {what} "
                                             "yet: use --engine tensorflow.$"):
            require(engine, what, "ctranslate2", method, option)
