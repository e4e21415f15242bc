"""Sequence-level distillation (`keras-transformer distill`): the student's corpus is the
teacher's translation of its training sources, made resumably (a distillation killed during
the translation ends with the same bytes as one left alone), recorded in the student's config,
and the student trains and resumes as any run. The refusals come before anything is loaded."""

import hashlib
import json
import pathlib
import sys

import pytest

from tests.conftest import RUNTIME_CLI, RUNTIME_PRESET, run_engine, toy_config
from tests.training_helpers import kill_once_exists, reversed_upper, write_corpus

REPOSITORY = pathlib.Path(__file__).resolve().parents[1]
PAIRS = 160  # 120 training pairs (the last 40 are the dev set)


def student_flags(output_dir, *extra, tune=False):
    """A tiny student, decoded and trained in float32 (the same bytes on every CPU class);
    search batches of 4 sentences, i.e. windows of 64 lines: 2 windows for 120 sources. One
    layer each side (half the graph each student training traces), and no best.keras (a model
    file written at each improving evaluation: tests/test_early_stopping.py checks it). Not
    tuned at the end unless `tune` (tests/test_tune.py checks the tuning itself)."""
    return ["--output-dir", str(output_dir), "--preset", RUNTIME_PRESET, "--vocab-size", "300",
            "--tokens-per-batch", "256", "--warmup-steps", "20", "--train-steps", "4",
            "--checkpoint-steps", "2", "--eval-steps", "4", "--verbose", "0",
            "--precision", "float32", "--teacher-precision", "float32",
            "--teacher-batch-size", "4", "--no-keep-best", "--num-layers", "1",
            *([] if tune else ["--no-tune"]), *extra]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory, runtime_preset):
    """A tiny teacher that says something: each target starts with "DER HUND", which 150 steps
    at half the paper's learning rate learn on every CPU class tried (a teacher of the tiny
    run's 20 steps answers every source with an empty line, on which no student trains; so
    did one of 80 steps at twice the rate on the amx class, whose float32 kernels round
    otherwise). Its search with beam 4 gives short lines. Two layers each side, as the
    package's tiny preset: one layer learned less in 150 steps, and its lines held more
    characters than the students' 300-piece vocabulary takes."""
    from keras_transformer.training import train

    folder = tmp_path_factory.mktemp("distill-teacher")
    corpus = write_corpus(folder / "corpus", pairs=PAIRS,
                          target=lambda source: "DER HUND " + reversed_upper(source))
    train(toy_config(corpus, folder / "run", train_steps=150, warmup_steps=20, lr_scale=0.5,
                     checkpoint_steps=150, eval_steps=150, num_layers=2))
    return folder / "run"


def distill(*arguments):
    from keras_transformer import cli

    return cli.main(["distill", *map(str, arguments)])


@pytest.mark.slow  # trains a teacher and two students, and kills a child process
def test_a_killed_distillation_ends_with_the_same_corpus_and_the_student_trains_and_resumes(
        teacher, tmp_path, capsys, graph_optimizer_on):  # this process's lines as the child's
    from keras_transformer.runs import Run

    from keras_transformer.runs.choices import TRIES

    whole, killed = Run(tmp_path / "whole"), Run(tmp_path / "killed")
    assert distill("--teacher", teacher, *student_flags(whole.directory, tune=True)) == 0
    corpus = whole.distilled_path("train", "de")
    lines = corpus.read_text(encoding="utf-8").splitlines()
    assert len(lines) == PAIRS - 40 and all(lines), "the teacher said nothing"
    assert whole.distilled_path("dev", "de").read_text(encoding="utf-8") == \
        "".join(line + "\n" for line in
                (teacher.parent / "corpus" / "dev.tgt").read_text(encoding="utf-8").splitlines())
    assert whole.has_model()
    assert TRIES in whole.decoding(), "the student was not tuned on its dev set"

    # Killed while the teacher translates: the config with its record is there, the corpus not.
    record = killed.distilled_path("train", "de").with_name("train.de.partial.json")
    error = kill_once_exists(
        [sys.executable, *RUNTIME_CLI, "distill", "--teacher", str(teacher),
         *student_flags(killed.directory)], record, cwd=REPOSITORY)
    assert record.exists(), f"the distillation ended before its first window: {error[-2000:]}"
    done = json.loads(record.read_text(encoding="utf-8"))["lines"]
    assert 0 < done < PAIRS - 40 and not killed.distilled_path("train", "de").exists()
    saved = json.loads(killed.config_path.read_text(encoding="utf-8"))
    assert saved["distill"]["teachers"] == [str(teacher.resolve())]
    assert list(saved["distill"]["teacher_config_sha256"].values()) == [
        hashlib.sha256(Run(teacher).config_path.read_bytes()).hexdigest()]
    assert saved["distill"]["teacher_decoding"]["beam_size"] == 4
    assert saved["distill"]["teacher_decoding"]["precision"] == "float32"
    assert saved["model"]["d_model"] == 32 and saved["data"]["dataset"] == "text"

    # An unfinished corpus comes from one teacher decoding one way: another beam is refused.
    capsys.readouterr()
    assert distill("--teacher", teacher, *student_flags(killed.directory, "--beam", "2")) == 2
    assert "the teachers changed" in capsys.readouterr().err

    # The same command again: the translation goes on, then the student trains.
    assert distill("--teacher", teacher, *student_flags(killed.directory)) == 0
    assert f"after the {done} input lines already done" in capsys.readouterr().err
    assert killed.distilled_path("train", "de").read_bytes() == corpus.read_bytes()
    assert killed.distilled_path("train", "en").read_bytes() == \
        whole.distilled_path("train", "en").read_bytes()
    assert killed.has_model()

    # Once the corpus is complete the student resumes as any run (here: extended), and the
    # teacher is not read again.
    assert distill("--teacher", teacher, *student_flags(killed.directory, "--train-steps", "6")
                   ) == 0
    out = capsys.readouterr()
    assert "the corpus in" in out.err and "is complete" in out.err
    assert "resumed from" in out.out and "at step 4" in out.out
    assert json.loads(out.out.strip().splitlines()[-1])["step"] == 6


def test_distill_flags_are_trains_less_what_distillation_decides(capsys):
    from keras_transformer import cli

    with pytest.raises(SystemExit):
        cli.main(["distill", "--help"])
    text = capsys.readouterr().out
    for flag in ("--teacher", "--beam", "--alpha", "--teacher-precision", "--train-steps",
                 "--d-model", "--precision", "--seed"):
        assert flag in text
    for flag in ("--dataset", "--train-src", "--dev-tgt", "--src-lang", "--init-from"):
        assert flag + " " not in text
    assert "(default multi30k-tiny)" in text


def test_distillation_refuses_what_it_decides_and_runs_that_are_not_students(tmp_path, capsys):
    from keras_transformer.runs import Run, make_config

    config_file = tmp_path / "student.yaml"
    config_file.write_text("data:\n  dataset: multi30k\n", encoding="utf-8")
    assert distill("--teacher", tmp_path, "--output-dir", tmp_path / "s",
                   "--config", config_file) == 2
    assert "distillation decides dataset" in capsys.readouterr().err

    assert distill("--teacher", tmp_path) == 2
    assert "--output-dir STUDENT" in capsys.readouterr().err

    assert distill("--teacher", tmp_path / "nothing", "--output-dir", tmp_path / "s") == 2
    assert "is not a training run directory" in capsys.readouterr().err

    other = Run(tmp_path / "other")
    other.save_config(make_config(output_dir=str(other.directory), preset="tiny"))
    assert distill("--teacher", tmp_path, "--output-dir", other.directory) == 2
    assert "was not distilled" in capsys.readouterr().err


def test_a_teacher_whose_training_sources_are_empty_is_refused_before_anything_is_written(
        run_copy, tmp_path, capsys):
    """Files emptied since the teacher trained: refused naming them, and the student run is
    not started (the same command with other teachers is not refused as another's student)."""
    config = json.loads((run_copy / "config.json").read_text(encoding="utf-8"))
    empty_src, empty_tgt = tmp_path / "train.src", tmp_path / "train.tgt"
    empty_src.write_bytes(b"")
    empty_tgt.write_bytes(b"")
    config["data"].update(train_src=str(empty_src), train_tgt=str(empty_tgt))
    (run_copy / "config.json").write_text(json.dumps(config), encoding="utf-8")
    student = tmp_path / "student"
    assert distill("--teacher", run_copy, *student_flags(student)) == 2
    assert (f"keras-transformer distill: error: No sentence pairs to read: {empty_src} and "
            f"{empty_tgt} are empty. Give line-aligned files") in capsys.readouterr().err
    assert not student.exists() or {p.name for p in student.iterdir()} <= {".lock"}


@pytest.mark.slow  # uses the trained teacher
def test_the_teachers_search_is_its_saved_choice_and_several_teachers_decode_as_an_ensemble(
        teacher, tmp_path):
    import shutil

    from keras_transformer.runs import Run, open_run
    from keras_transformer.tasks.distill import (AssembledEnsemble, open_teachers, record,
                                                 teacher_decoder)

    first, second = tmp_path / "a", tmp_path / "b"
    for copy in (first, second):
        shutil.copytree(teacher, copy)
    Run(first).save_decoding(beam_size=3, alpha=1.0, chosen_by="a test, on val")

    def recorded(teachers, **search):
        teacher = open_teachers([open_run(path) for path in teachers])
        decoder = teacher_decoder(teacher, dict(batch_size=8, precision="float32", **search))
        return teacher, record(teachers, decoder)

    decoding = recorded([str(first)])[1]["teacher_decoding"]
    assert (decoding["beam_size"], decoding["alpha"], decoding["chosen_by"]) == (
        3, 1.0, "a test, on val")
    assert decoding["origins"] == {"model": "default", "beam_size": "run", "alpha": "run"}
    assert recorded([str(first)], beam_size=2)[1]["teacher_decoding"]["beam_size"] == 2

    # Runs given together: one ensemble, never chosen for as a whole (the defaults decode).
    both, record_of_both = recorded([str(first), str(second)])
    assert isinstance(both, AssembledEnsemble) and len(both.members) == 2
    assert record_of_both["teachers"] == [str(first), str(second)]
    assert sorted(record_of_both["teacher_config_sha256"]) == [str(first), str(second)]
    assert record_of_both["teacher_decoding"]["beam_size"] == 4
    assert record_of_both["teacher_decoding"]["models"] == [str(first / "model.keras"),
                                                            str(second / "model.keras")]
    # The mean of a model's probabilities with its own copy is that model's: the same search.
    sources = (teacher.parent / "corpus" / "train.src").read_text(encoding="utf-8").split("\n")
    options = dict(beam_size=4, alpha=0.6, precision="float32")
    assert run_engine(both, **options).translate(sources[:8]) == \
        run_engine(Run(first), **options).translate(sources[:8])
