"""The run directory: self-contained configs, resume after a move, a preset change or a damaged
checkpoint, the vocabulary cache, the saved decoding choices, atomic files, and the command
line's error rule."""

import json
import logging
import os
import re
import shutil

import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer.errors import ConfigError, RunError
from keras_transformer.models import presets
from keras_transformer.runs import Run
from keras_transformer.runs.run import (FORMAT_VERSION, TEMPORARY_PREFIX, atomic_path,
                                        remove_stale_temporaries, write_text)
from keras_transformer.training import train
from tests.conftest import RUNTIME_PRESET, toy_config


def test_config_json_is_self_contained(tiny_run):
    saved = json.loads((tiny_run / "config.json").read_text())
    assert saved["format_version"] == FORMAT_VERSION
    assert saved["model"] == {**saved["model"], "num_layers": 1, "d_model": 32,
                              "num_heads": 4, "d_ff": 64, "key_dim": 8, "value_dim": 8}
    training = saved["optimization"]
    assert (training["train_steps"], training["warmup_steps"], training["label_smoothing"]) \
        == (20, 50, 0.1)
    run = Run(tiny_run)
    assert run.config.to_dict()["model"] == {**saved["model"]}
    assert [os.path.basename(p) for p in run.checkpoints()] == [
        "ckpt-10.weights.h5", "ckpt-20.weights.h5"]
    assert [Run.checkpoint_step(p) for p in run.checkpoints()] == [10, 20]


@pytest.mark.slow
def test_a_moved_run_with_a_changed_preset_evaluates_averages_and_resumes_as_saved(
        run_copy, toy_corpus, runtime_preset, tmp_path, capsys):
    # The run directory moved and renamed, and its preset changed since it trained: the run
    # finds its own files where it is now, and its saved architecture wins over today's preset.
    moved = tmp_path / "elsewhere" / "renamed"
    moved.parent.mkdir()
    shutil.move(run_copy, moved)
    presets.PRESETS[RUNTIME_PRESET]["model"].update(d_model=48, num_heads=2)
    try:
        # evaluate
        assert cli.main(["evaluate", "--run-dir", str(moved), "--src",
                         str(toy_corpus["dev.src"]), "--ref", str(toy_corpus["dev.tgt"]), "--beam",
                         "2"]) == 0
        assert '"sacrebleu"' in capsys.readouterr().out
        # average
        assert cli.main(["average", "--run-dir", str(moved), "--last", "2"]) == 0
        averaged = Run(moved).load_model()
        assert averaged.d_model == 32
        # resume
        capsys.readouterr()
        # keep_best off (here and below): best.keras is tests/test_early_stopping.py's.
        summary = train(toy_config(toy_corpus, moved, train_steps=25, keep_best=False))
        out = capsys.readouterr().out
        assert re.search(r"resumed from .*renamed/checkpoints/ckpt-20\.weights\.h5 at step 20",
                         out), out
        assert (summary["start_step"], summary["step"]) == (20, 25)
        assert Run(moved).load_model(prefer_averaged=False).d_model == 32
        assert Run(moved).config.output_dir == str(moved)
    finally:
        presets.PRESETS[RUNTIME_PRESET]["model"].update(d_model=32, num_heads=4)


def test_resume_refuses_a_different_architecture_by_name(run_copy, toy_corpus):
    with pytest.raises(ConfigError, match=r"d_model: 32 -> 64.*train_steps"):
        train(toy_config(toy_corpus, run_copy, d_model=64))
    with pytest.raises(ConfigError, match=r"vocab_size: 400 -> 500"):
        train(toy_config(toy_corpus, run_copy, vocab_size=500))
    # Keys equal to the saved architecture, and the resumable keys, may be given.
    config = Run(run_copy).config_for(toy_config(toy_corpus, run_copy, d_model=32, num_layers=1,
                                                 train_steps=40, eval_steps=7))
    assert (config.train_steps, config.eval_steps, config.architecture["d_model"]) == (40, 7, 32)


def truncate_newest_checkpoint(run_dir):
    path = run_dir / "checkpoints" / "ckpt-20.weights.h5"
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)
    return path


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_is_named_and_the_one_before_is_used(
        run_copy, toy_corpus, caplog, capsys):
    truncate_newest_checkpoint(run_copy)
    with caplog.at_level(logging.WARNING):
        assert cli.main(["average", "--run-dir", str(run_copy), "--last", "2"]) == 0
    damaged = [r for r in caplog.records if "ckpt-20" in r.getMessage()]
    assert len(damaged) == 1 and "damaged" in damaged[0].getMessage()
    assert "averaged 1 checkpoints (ckpt-10.weights.h5)" in capsys.readouterr().out

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        summary = train(toy_config(toy_corpus, run_copy, train_steps=30, keep_best=False))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING
                and "damaged" in r.getMessage()]
    assert len(warnings) == 1 and "ckpt-20" in warnings[0], warnings
    assert re.search(r"resumed from .*ckpt-10\.weights\.h5 at step 10", capsys.readouterr().out)
    assert (summary["start_step"], summary["step"]) == (10, 30)
    assert os.path.basename(Run(run_copy).checkpoints()[-1]) == "ckpt-30.weights.h5"


def test_a_format_1_run_still_loads(run_copy):
    path = run_copy / "config.json"
    values = as_format_2(json.loads(path.read_text()))
    del values["format_version"], values["architecture"]
    path.write_text(json.dumps(values))
    run = Run(run_copy)
    assert run.config.architecture["d_model"] == 32  # from today's preset, all it recorded
    assert run.load_model().d_model == 32
    assert run.build_model().count_params() == run.load_model().count_params()


def as_format_2(document):
    """config.json as keras-transformer 0.2.0 (a53229c) wrote it from `document` (this
    version's): flat keys, the architecture keys at the top mostly null, the resolved
    architecture beside them."""
    flat = {key: value for section in ("model", "data", "optimization", "run")
            for key, value in document[section].items()}
    architecture = {key: flat[key] for key in ("num_layers", "d_model", "num_heads", "d_ff",
                                               "key_dim", "value_dim", "dropout", "norm_first",
                                               "positional")}
    if flat["max_positions"] is not None:
        architecture["max_length"] = flat["max_positions"]
    old = {"format_version": 2, **flat, **{key: None for key in architecture}}
    del old["max_positions"]
    old["architecture"] = architecture
    return old


def test_not_a_run_and_damaged_files_are_named(tmp_path, run_copy):
    with pytest.raises(RunError, match="not a training run directory"):
        Run(tmp_path).config
    (run_copy / "config.json").write_text("{not json")
    with pytest.raises(RunError, match="config.json is damaged"):
        Run(run_copy).config


def test_a_run_keeps_its_vocabulary(run_copy, tmp_path):
    run = Run(run_copy)
    own = run.tokenizer_path.read_bytes()
    same = tmp_path / "same.model"
    same.write_bytes(own)
    assert run.use_vocabulary(same).vocab_size == run.tokenizer().vocab_size
    other = tmp_path / "other.model"
    other.write_bytes(own + b"x")
    with pytest.raises(RunError, match="differs from the vocabulary of the prepared data"):
        run.use_vocabulary(other)
    assert run.tokenizer_path.read_bytes() == own


def test_atomic_writes_keep_the_old_file_on_failure_and_clean_up(tmp_path):
    target = tmp_path / "out" / "file.txt"
    write_text(target, "old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as temporary:
            temporary.write_text("half")
            raise RuntimeError("killed")
    assert target.read_text() == "old"
    assert os.listdir(target.parent) == ["file.txt"]
    folder = tmp_path / "version"
    for content in ("first", "second"):
        with atomic_path(folder) as temporary:
            temporary.mkdir()
            (temporary / "data").write_text(content)
    assert (folder / "data").read_text() == "second"
    # What a killed writer left (its process is gone) goes; a live writer's stays.
    dead = tmp_path / f"{TEMPORARY_PREFIX}999999999-file.txt"
    live = tmp_path / f"{TEMPORARY_PREFIX}{os.getpid()}-other.txt"
    dead.write_text("x")
    live.write_text("x")
    remove_stale_temporaries(tmp_path)
    assert not dead.exists() and live.exists()


def test_cli_exit_status_user_errors_2_internal_errors_1(tmp_path, monkeypatch, capsys):
    assert cli.main(["translate", "--run-dir", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

    def broken(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(cli.models, "presets", broken)
    assert cli.main(["presets"]) == 1
    assert "internal error: ZeroDivisionError: a bug (run again with --debug" in \
        capsys.readouterr().err
    with pytest.raises(ZeroDivisionError):
        cli.main(["presets", "--debug"])
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "exit status: 0 done; 2 a user error" in capsys.readouterr().out


@pytest.mark.slow
def test_a_resumed_run_trains_on_exactly_the_batches_of_an_uninterrupted_one(
        toy_corpus, runtime_preset, tmp_path):
    # Without dropout, training is a function of the batches: a run killed after its step-6
    # checkpoint and resumed must end with the weights of a run that never stopped. Small
    # shards (several groups and epochs in 12 steps) and gradient accumulation make the data
    # position more than the step.
    settings = dict(dropout=0.0, shard_pairs=60, grad_accum_steps=2, tokens_per_batch=128,
                    train_steps=12, checkpoint_steps=6, eval_steps=12)
    train(toy_config(toy_corpus, tmp_path / "whole", **settings))
    # The killed run: the uninterrupted run's files as they were between steps 6 and 12 (its
    # step-6 checkpoint; no later checkpoint, final model or best model yet).
    shutil.copytree(tmp_path / "whole", tmp_path / "pieces")
    later = [*(tmp_path / "pieces" / "checkpoints").glob("ckpt-12.*"),
             *(tmp_path / "pieces" / name for name in ("model.keras", "best.keras", "best.json"))]
    assert len(later) == 5, later
    for path in later:
        path.unlink()
    summary = train(toy_config(toy_corpus, tmp_path / "pieces", **settings))
    assert summary["start_step"] == 6
    pieces = Run(tmp_path / "pieces")
    assert [Run.data_position(p) for p in pieces.checkpoints()] == [12, 24]  # 2 per step
    whole = Run(tmp_path / "whole").load_model().get_weights()
    for a, b in zip(whole, pieces.load_model().get_weights()):
        np.testing.assert_array_equal(a, b)


# -- the decoding choices (decoding.json) -------------------------------------------------------


def test_decoding_choices_round_trip_and_merge(tmp_path):
    run = Run(tmp_path / "run")
    assert run.decoding() == {}
    first = run.save_decoding(model="averaged.keras", weights="average of the last 5 checkpoints",
                              beam_size=4, alpha=1.0, chosen_by="the main job, on val")
    assert first == {"model": "averaged.keras", "weights": "average of the last 5 checkpoints",
                     "beam_size": 4, "alpha": 1.0, "chosen_by": "the main job, on val"}
    saved = json.loads(run.decoding_path.read_text(encoding="utf-8"))
    assert saved == {"format_version": 1, **first}
    assert Run(run.directory).decoding() == first
    # A later choice changes its keys only.
    merged = run.save_decoding(alpha=0.6, chosen_by="tune, on val")
    assert merged == {**first, "alpha": 0.6, "chosen_by": "tune, on val"}
    assert Run(run.directory).decoding() == merged
    assert run.save_decoding(model=None)["model"] is None
    assert [name for name in os.listdir(run.directory)] == ["decoding.json"]  # no temporaries
    with pytest.raises(ValueError, match="'decoding.json' is not a free file name"):
        run.file("decoding.json")


@pytest.mark.parametrize("choices, message", [
    (dict(beam=4), r"unknown decoding choice\(s\) \['beam'\]"),
    (dict(model="../other/model.keras"), "model must name a .keras file inside the run"),
    (dict(model="model.h5"), "model must name a .keras file inside the run"),
    (dict(weights=5), "weights must be a text or null; got 5"),
])
def test_bad_decoding_choices_are_named_and_nothing_is_written(tmp_path, choices, message):
    run = Run(tmp_path)
    run.save_decoding(beam_size=2)
    with pytest.raises(ValueError, match=message):
        run.save_decoding(**choices)
    assert run.decoding() == {"beam_size": 2}


@pytest.mark.parametrize("content, message", [
    ('{"beam_size": 4, "alp', "is damaged \\(not JSON"),
    ("[1, 2]", "is damaged \\(not a JSON object\\)"),
    ('{"beam_size": 4}', "is damaged \\(no format_version\\)"),
    ('{"format_version": 1, "weights": 4}', "is damaged \\(weights must be a text"),
    ('{"format_version": 9, "beam_size": 4}', "has format version 9, newer than"),
])
def test_a_damaged_decoding_file_raises_run_error_naming_it(tmp_path, content, message):
    run = Run(tmp_path)
    run.decoding_path.write_text(content, encoding="utf-8")
    for action in (run.decoding, lambda: run.save_decoding(alpha=0.6),
                   run.decoding_model_path):
        with pytest.raises(RunError, match=re.escape(str(run.decoding_path)) + ".*" + message):
            action()


def test_the_decoding_model_is_the_chosen_file_else_averaged_else_final(tmp_path, caplog):
    run = Run(tmp_path)
    run.model_path.write_bytes(b"final")
    assert run.decoding_model_path() == run.model_path
    run.averaged_path.write_bytes(b"averaged")
    assert run.decoding_model_path() == run.averaged_path
    run.save_decoding(beam_size=4)  # no model chosen: the default
    assert run.decoding_model_path() == run.averaged_path
    run.save_decoding(model="model.keras", weights="the final weights")
    assert run.decoding_model_path() == run.model_path
    run.save_decoding(model="best.keras")  # named, but not there: the default, with a warning
    with caplog.at_level(logging.WARNING):
        assert run.decoding_model_path() == run.averaged_path
    assert any("best.keras" in r.getMessage() for r in caplog.records)
