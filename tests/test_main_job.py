"""The re-tuned main job's pieces: the Multi30k literature BLEU convention, a recipe bounded by
steps, the choices made on val, quiet third-party logs. (The progress bar over the run's steps:
tests/test_tensorboard.py, on the resumed run there.)"""

import gzip
import os
import subprocess
import sys

import pytest

from keras_transformer.evaluation.bleu import literature_bleu, literature_tokenize, score
from keras_transformer.runs import Run, make_config
from keras_transformer.tasks import main_job, tuning
from pipelines import datasets


def _raw(folder, name):
    with gzip.open(folder / name, "rt", encoding="utf-8") as handle:
        return handle.read().splitlines()


def test_normalizing_raw_references_reproduces_the_official_tokenized_ones(shared_data):
    folder = shared_data / "multi30k"
    for split, stem in (("test", "test_2016_flickr"), ("dev", "val")):
        raw = _raw(folder, f"{stem}.de.gz")
        official = datasets.official_tokenized_references("multi30k", split, "de", folder)
        assert official is not None and len(official) == len(raw)
        differing = sum(a != b for a, b in zip(literature_tokenize(raw, "de"), official))
        # test2016: every line; val: one line differs (a quote moved after the full stop).
        assert differing == {"test": 0, "dev": 1}[split]
    assert datasets.official_tokenized_references("multi30k", "train", "de", folder) is None
    assert datasets.official_tokenized_references("text", "test", "de", folder) is None


def test_literature_bleu_lowercases_tokenizes_and_escapes():
    assert literature_tokenize(['Ein "Hund" läuft.'], "de") == ["ein &quot; hund &quot; läuft ."]
    references = ['Ein "Hund" läuft im Schnee.', "Zwei Männer spielen Schach im Park."]
    # Case and tokenization do not count in this convention; sacreBLEU sees them.
    hypotheses = ['ein " hund " läuft im schnee .', "ZWEI MÄNNER SPIELEN SCHACH IM PARK."]
    value, kind = literature_bleu(hypotheses, references, "de")
    assert (value, kind) == (100.0, "normalized")
    result = score(hypotheses, references, lang="de")
    assert result["literature_bleu"] == 100.0 and result["sacrebleu"] < 50
    assert "Multi30k literature convention" in result["lines"][-1]
    official = literature_tokenize(references, "de")
    assert literature_bleu(hypotheses[:1] + ["zwei männer"], references, "de", official)[1] \
        == "official"
    assert literature_bleu(["Ein Hund."] * 2, references, "de")[0] < 100
    with pytest.raises(ValueError, match="2 hypotheses for 1 official"):
        literature_bleu(hypotheses, references, "de", official[:1])


def test_both_recipes_are_bounded_by_steps_not_by_the_clock():
    for mode in (main_job.recipe(), main_job.recipe(True), main_job.recipe(True, "fr")):
        config = make_config(None, **mode).resolved()
        assert config.time_limit_minutes is None and config.train_steps == mode["train_steps"]
        assert config.dropout == mode["dropout"]
        # Checkpoints by steps only, so averaging candidates are evenly spaced: a checkpoint
        # every checkpoint_steps up to the last step, and the minutes' clock does not fire
        # within a day of training (the full recipe's three members take about 7 hours).
        assert config.checkpoint_steps and config.train_steps % config.checkpoint_steps == 0
        assert config.checkpoint_minutes >= 24 * 60
    # The full recipe keeps every checkpoint the widest averaging candidate needs.
    assert main_job.FULL["keep_checkpoints"] >= max(
        (k - 1) * every + 1 for k, every in main_job.AVERAGE_CANDIDATES)


def test_the_summary_says_which_steps_a_resumed_piece_trained():
    line = main_job._training_line({"start_step": 900, "step": 5500, "seconds": 7508.2,
                                    "stopped": "reached train_steps=5500", "val_perplexity": 5.6})
    assert "step 5500 (this piece: steps 900-5500) in 125.1 min" in line
    assert "this piece" not in main_job._training_line({"start_step": 0, "step": 1200})


def test_averages_may_take_every_other_checkpoint(run_copy, caplog):
    run = Run(run_copy)  # checkpoints at steps 10 and 20
    _, used = run.average(2, every=2)
    assert [os.path.basename(p) for p in used] == ["ckpt-20.weights.h5"]
    assert "Asked to average 2 checkpoints 2 apart" in caplog.text
    _, used = run.average(2)
    assert [os.path.basename(p) for p in used] == ["ckpt-10.weights.h5", "ckpt-20.weights.h5"]


@pytest.mark.slow  # a fresh interpreter importing TensorFlow (about 7 CPU-s)
def test_the_command_hides_third_party_logs_unless_verbose():
    script = os.path.join(os.path.dirname(sys.executable), "keras-transformer")
    command = [script, "params", "--preset", "tiny", "--vocab-size", "100"]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    quiet = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert quiet.returncode == 0 and "total" in quiet.stdout
    assert quiet.stderr == ""


# The same job with two targets (per-pair tables, scores and examples) ran here too until the
# suite outgrew its budget (2026-12-02): the per-pair table is tests/test_multilingual.py's.
# The choice of the length penalty on val (every alpha of ALPHAS tried) and of the repetition
# controls after it (off not decoded again) are checked on this job's run too: each had a test
# of its own on tiny_run (its own beam searches, each traced) until 2026-12-02.
@pytest.mark.slow  # trains a tiny model on Multi30k and exports it (about a minute)
def test_the_demo_job_end_to_end_choosing_the_length_penalty_then_the_controls_on_val(
        shared_data, runtime_preset, tmp_path, monkeypatch, capsys):
    """The job end to end with a tiny model and a few sentences per split: the length penalty
    chosen on val among every alpha of ALPHAS, then the repetition controls with it (off is the
    chosen alpha's own output, not decoded again), the choice saved, test2016 scored, the
    SavedModel and the CTranslate2 int8 folder exported through `export_run` with that choice,
    the examples through the SavedModel."""
    import json

    pytest.importorskip("ctranslate2")
    cut = main_job.pair_texts

    def few(config):  # the first sentences of each split, for speed
        return {target: {split: tuple(side[:12] for side in texts)
                         for split, texts in splits.items()}
                for target, splits in cut(config).items()}

    official = datasets.official_tokenized_references
    monkeypatch.setattr(main_job, "pair_texts", few)
    monkeypatch.setattr(datasets, "official_tokenized_references",
                        lambda *args: (official(*args) or [])[:12] or None)
    monkeypatch.setattr(main_job, "VAL_SENTENCES", 6)
    # Every alpha (main_job.ALPHAS: four beam searches on val), then one more search for the
    # repetition controls (off is the chosen alpha's own output).
    ngram = (3, 1.0)
    monkeypatch.setattr(tuning, "REPETITION_CANDIDATES", (tuning.REPETITION_OFF, ngram))
    searches = []
    made = tuning._beam_searcher

    def counted(*args):
        searcher = made(*args)
        return lambda **values: searches.append(values) or searcher(**values)

    monkeypatch.setattr(tuning, "_beam_searcher", counted)
    # One layer each side (the quick recipe has two): half the graph to trace and export.
    settings = dict(preset=runtime_preset, num_layers=1, vocab_size=400, tokens_per_batch=512,
                    max_length=32, precision="float32", source_dir=str(shared_data / "multi30k"),
                    verbose=0)
    run_dir, exports = tmp_path / "run", tmp_path / "exports"
    summary = main_job.run(tgt_lang="de",
                           output_dir=str(run_dir), export_dir=str(exports), train_steps=10,
                           settings=settings)
    out = capsys.readouterr().out
    name = "multi30k-en-de-quick"
    choice = json.loads((run_dir / "decoding.json").read_text(encoding="utf-8"))
    assert (choice["beam_size"], choice["alpha"], choice["model"]) == (
        4, summary["alpha"], "averaged.keras")
    assert (choice["no_repeat_ngram_size"], choice["repetition_penalty"]) in \
        tuning.REPETITION_CANDIDATES
    # The length penalty: every alpha tried on val, the best sacreBLEU kept.
    scores = summary["val_beam_sacrebleu_by_alpha"]
    assert summary["alpha"] in main_job.ALPHAS and sorted(map(float, scores)) == sorted(
        main_job.ALPHAS)
    assert max(bleu for bleu, _ in scores.values()) == scores[str(summary["alpha"])][0]
    assert "alpha 1.4: sacreBLEU" in out
    # Then the controls with it: one more search, off not decoded again.
    assert len(searches) == len(main_job.ALPHAS) + 1 and searches[-1][
        "no_repeat_ngram_size"] == ngram[0]
    by_setting = summary["val_beam_by_repetition"]
    assert set(by_setting) == {"off", "no_repeat_ngram_size 3"}
    assert by_setting["off"]["sacrebleu"] == scores[str(summary["alpha"])][0]
    setting = (choice["no_repeat_ngram_size"], choice["repetition_penalty"])
    figures = {key: (v["sacrebleu"], v["stutters"])
               for key, v in zip((tuning.REPETITION_OFF, ngram), by_setting.values())}
    assert setting == tuning.pick_repetition(figures)
    assert summary["repetition"] == tuning.repetition_label(setting)
    assert summary["repetition"] in by_setting
    assert "no_repeat_ngram_size 3: sacreBLEU" in out
    assert json.loads((run_dir / main_job.SUMMARY).read_text(encoding="utf-8")) == \
        json.loads(json.dumps(summary))
    assert summary["saved_model"] == str(exports / name / "1")
    folder = exports / name / "ctranslate2-int8"
    assert (folder / "model.bin").is_file()
    assert f"--engine ctranslate2 --ctranslate2-model {folder}" in out
    assert set(summary["test2016"]) >= {"sacrebleu", "chrf", "literature_bleu"}
    assert (run_dir / "hyp.test2016.beam4.txt").is_file()
    assert list(summary["examples"]) == main_job.EXAMPLES
    assert "pair " not in out  # one pair: no table


def test_the_demo_says_how_to_add_ctranslate2_and_goes_on(tiny_run, tmp_path, monkeypatch,
                                                          capsys):
    from keras_transformer.decoding.engines.ctranslate2 import INSTALL_HINT
    from keras_transformer.errors import InputError
    from keras_transformer.export import ct2
    from tests.conftest import run_decoder

    def missing():
        raise InputError(f"The ctranslate2 package is not installed: {INSTALL_HINT}.")

    monkeypatch.setattr(ct2, "require_ctranslate2", missing)
    assert main_job.export_ctranslate2(run_decoder(tiny_run), tmp_path, "toy") is None
    assert "pip install 'keras-transformer[ctranslate2]'" in capsys.readouterr().out
    assert not (tmp_path / "toy").exists()
