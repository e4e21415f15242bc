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
from keras_transformer.tasks import main_job
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


@pytest.mark.slow  # four beam searches, each traced (about 13 s)
def test_main_job_chooses_the_length_penalty_on_val(tiny_run, capsys):
    run = Run(tiny_run)
    sources, references = datasets.pair_texts(
        datasets.load_pairs("text", "dev", **run.config.data_arguments()), 12)
    alpha, scores = main_job.choose_alpha(run.load_model(), run.tokenizer(),
                                          run.config.max_length, sources, references, beam=2)
    assert alpha in main_job.ALPHAS and sorted(scores) == sorted(main_job.ALPHAS)
    assert max(bleu for bleu, _ in scores.values()) == scores[alpha][0]
    assert "alpha 1.4: sacreBLEU" in capsys.readouterr().out


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


def test_the_command_hides_third_party_logs_unless_verbose():
    script = os.path.join(os.path.dirname(sys.executable), "keras-transformer")
    command = [script, "params", "--preset", "tiny", "--vocab-size", "100"]
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    quiet = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert quiet.returncode == 0 and "total" in quiet.stdout
    assert quiet.stderr == ""
