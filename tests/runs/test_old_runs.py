"""A run written by keras-transformer 0.2.0 (a53229c: config.json of format 2, flat keys with
the architecture beside them) resumes, averages, translates and exports with this version."""

import json

import pytest

from keras_transformer import cli
from keras_transformer.runs import Run
from keras_transformer.training import train
from tests.conftest import toy_config
from tests.runs.test_run import as_format_2


@pytest.fixture
def old_run(run_copy):
    path = run_copy / "config.json"
    path.write_text(json.dumps(as_format_2(json.loads(path.read_text()))))
    return run_copy


def test_an_old_runs_config_reads_as_it_was_trained(old_run, tiny_run):
    assert Run(old_run).config.values() == {**Run(tiny_run).config.values(),
                                            "output_dir": str(old_run)}


@pytest.mark.slow  # trains 5 steps, averages, translates and exports a SavedModel
def test_an_old_run_resumes_averages_translates_and_exports(old_run, toy_corpus, tmp_path,
                                                            capsys):
    # keep_best off: best.keras is tests/test_early_stopping.py's.
    summary = train(toy_config(toy_corpus, old_run, train_steps=25, keep_best=False))
    assert (summary["start_step"], summary["step"]) == (20, 25)
    saved = json.loads((old_run / "config.json").read_text())
    assert saved["format_version"] == 3 and saved["optimization"]["train_steps"] == 25

    assert cli.main(["average", "--run-dir", str(old_run), "--last", "2"]) == 0
    output = tmp_path / "out.txt"
    assert cli.main(["translate", "--run-dir", str(old_run), "--input",
                     str(toy_corpus["dev.src"]), "--output", str(output), "--beam", "2"]) == 0
    lines = output.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(toy_corpus["dev.src"].read_text(encoding="utf-8").splitlines())
    # The SavedModel's search on ids (the strings signatures add only the tokenizer, which the
    # translation above read, around the same search, and triple the export's tracing).
    assert cli.main(["export", "--run-dir", str(old_run), "--output-dir",
                     str(tmp_path / "exported"), "--ids-only"]) == 0
    assert (tmp_path / "exported" / "run" / "1" / "saved_model.pb").is_file()
