"""The command-line face of the decoding request: translate --prefix, translate --sample,
keras-transformer score; the request declared once (flags, checks, the stderr line), and an
engine refusing what it does not support, in one place."""

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
    (["--sample", "--top-k", "-1"], r"--top-k -1 must be at least 0 \(0: no top-k cut\)"),
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


@pytest.mark.slow
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


@pytest.mark.slow  # the score command (fast with alignments: test_alignment_commands.py)
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


def test_an_engine_without_an_option_is_refused_by_name_in_one_place():
    from keras_transformer.decoding.engines.engine import Engine
    from keras_transformer.errors import InputError

    class OlderEngine(Engine):  # an engine from before prefixes, sampling and scoring
        NAME = "older"
        SUPPORTS = frozenset({"beam_size", "alpha", "batch_size", "nbest"})

    engine = OlderEngine()
    OlderEngine.refuse_unsupported({"nbest": True, "beam_size": 2})
    for call, what in ((lambda: engine.translate(["a"], prefixes=["b"]), "prefixes"),
                       (lambda: engine.translate(["a"], alignments=True), "alignments"),
                       (lambda: engine.sample(["a"]), "sample"),
                       (lambda: engine.score(["a"], ["b"]), "score")):
        with pytest.raises(InputError, match=f"^the older engine does not support {what} yet; "
                                             "the tensorflow engine does.$"):
            call()


def test_an_option_added_to_the_request_reaches_the_flags_the_check_and_the_stderr_line(
        tiny_run, tmp_path, capsys, monkeypatch):
    import dataclasses

    from keras_transformer.decoding import request
    from keras_transformer.errors import InputError
    from keras_transformer.runs.settings import Range

    @dataclasses.dataclass(frozen=True)
    class Extended(request.Request):
        length_ratio: float = request.option(
            1.5, "longest output as a multiple of the input's length", check=Range(low=0),
            commands=(request.TRANSLATE,))

    monkeypatch.setattr(request, "Request", Extended)
    # The flag, with its default and its range.
    with pytest.raises(SystemExit):
        cli.main(["translate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--length-ratio LENGTH_RATIO longest output as a multiple of the input's length " \
        "(default 1.5; at least 0)" in help_text
    # The Python check and the flag's.
    with pytest.raises(InputError, match=r"^length_ratio=-1.0 must be at least 0\.$"):
        request.check({"length_ratio": -1.0})
    assert cli.main(["translate", "--run-dir", str(tiny_run), "--length-ratio", "-2"]) == 2
    assert "--length-ratio -2.0 must be at least 0." in capsys.readouterr().err
    # The stderr line, where the value came from; and the engine refuses what it lacks.
    flags = ["translate", "--run-dir", str(tiny_run), "--beam", "1", "--precision", "float32",
             "--input", write(tmp_path / "in.txt", ["a dog"]), "--output", str(tmp_path / "o")]
    assert cli.main(flags) == 0
    assert ", length_ratio 1.5" in capsys.readouterr().err
    assert cli.main([*flags, "--length-ratio", "2"]) == 2
    assert "the tensorflow engine does not support length_ratio yet." in \
        capsys.readouterr().err


def test_a_sampling_default_and_range_are_declared_once_in_the_package():
    import pathlib

    from keras_transformer.decoding import request

    package = pathlib.Path(__file__).resolve().parents[1] / "keras_transformer"
    patterns = {  # the top_p range (a rule in words, a comparison, a declaration) and default
        "range": re.compile(r"\(0, 1\]|top_p\s*<=\s*1|0\.?0?\s*<\s*top_p|top_p\s*>\s*0"
                            r"|Range\(0, 1,"),
        "default": re.compile(r"top_p\s*=\s*(1\.0|tf\.constant\(1)|\"top_p\":\s*1\.0"
                              r"|top_p: float = option\("),
    }
    for what, pattern in patterns.items():
        # where sampling is read: decoding, export, the server, the command (a training setting may have
        # the same interval, say a cooldown's share of the steps)
        found = [(str(path.relative_to(package)), line)
                 for folder in ("decoding", "export", "serving", "cli")
                 for path in (package / folder).rglob("*.py")
                 for line in path.read_text(encoding="utf-8").splitlines()
                 if pattern.search(line)]
        assert [path for path, _ in found] == ["decoding/request.py"], (what, found)
    assert request.DEFAULTS["top_p"] == 1.0 and request.RANGES["top_p"].rule().startswith(
        "in (0, 1]")
