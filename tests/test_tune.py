"""`keras-transformer tune` (the `tune` stage, tasks/stages.py) on a run trained on the test's
own text files: the choice and every try saved in decoding.json, `translate` decoding with it,
`train` tuning at its end, and the refusals that name what is missing. (The demo's own use of
the stage: tests/test_main_job.py.)"""

import json

import pytest

from keras_transformer import cli
from keras_transformer.decoding.decoder import Decoder
from keras_transformer.errors import InputError, RunError
from keras_transformer.runs import Run
from keras_transformer.tasks import stages, tuning
from tests.test_multilingual import multi_run, two_corpora  # noqa: F401  (fixtures)


def _small_grid(monkeypatch):
    """Two alphas and one control besides off: three beam searches instead of eight."""
    monkeypatch.setattr(tuning, "ALPHAS", (0.6, 1.4))
    monkeypatch.setattr(tuning, "REPETITION_CANDIDATES", (tuning.REPETITION_OFF, (3, 1.0)))


@pytest.mark.slow  # trains a tiny run 10 steps further, tunes it twice (about a minute)
def test_train_tunes_at_its_end_then_tune_chooses_on_given_files_and_translate_follows(
        run_copy, toy_corpus, tmp_path, monkeypatch, capsys):
    _small_grid(monkeypatch)
    run_dir = run_copy  # the toy corpus' dev files in its config; 20 steps, no choice saved
    assert not Run(run_dir).decoding_path.exists()
    assert cli.main(["train", "--output-dir", str(run_dir), "--train-steps", "30"]) == 0
    out = capsys.readouterr().out
    assert "tune: choosing the weights, alpha and repetition controls on the run's dev set" in out
    run = Run(run_dir)
    after_train = run.decoding()
    assert after_train["chosen_by"] == "keras-transformer tune on the run's dev set (en-de: 40 " \
        "sentences)"
    assert len(after_train["tries"]) == 1 + 2 + 2  # final weights; two alphas; off, 3-grams

    # On given files, fewer sentences: the tries of this choice replace the training's.
    dev_src, dev_ref = tmp_path / "dev.en", tmp_path / "dev.de"
    dev_src.write_bytes(toy_corpus["dev.src"].read_bytes())
    dev_ref.write_bytes(toy_corpus["dev.tgt"].read_bytes())
    assert cli.main(["tune", "--run-dir", str(run_dir), "--src", str(dev_src), "--ref",
                     str(dev_ref), "--max-sentences", "12"]) == 0
    out = capsys.readouterr().out
    saved = json.loads(run.decoding_path.read_text(encoding="utf-8"))
    assert saved["format_version"] == 3
    assert saved["chosen_by"] == (f"keras-transformer tune on the first 12 sentences of "
                                  f"{dev_src} / {dev_ref} (en-de)")
    assert (saved["model"], saved["weights"], saved["beam_size"]) == (
        "averaged.keras", "final weights", 4)
    tries = saved["tries"]
    assert [t["search"] for t in tries] == ["greedy", "beam 4", "beam 4", "beam 4", "beam 4"]
    assert [t.get("alpha") for t in tries[1:3]] == [0.6, 1.4]
    # Each choice is the best of its tries (the controls: by the rule, `pick_repetition`).
    by_alpha = {t["alpha"]: t["sacrebleu"] for t in tries[1:3]}
    assert by_alpha[saved["alpha"]] == max(by_alpha.values())
    controls = {(t["no_repeat_ngram_size"], t["repetition_penalty"]): (t["sacrebleu"],
                                                                        t["stutters"])
                for t in tries[3:]}
    assert all(t["alpha"] == saved["alpha"] for t in tries[3:])
    assert (saved["no_repeat_ngram_size"], saved["repetition_penalty"]) == \
        tuning.pick_repetition(controls)
    assert "dev (first 12 sentences, greedy): final weights: sacreBLEU" in out
    assert f"-> {run.decoding_path}" in out

    # translate decodes with that choice: every value from the run, and its output is the
    # output of the same values given.
    output = tmp_path / "out.de"
    assert cli.main(["translate", "--run-dir", str(run_dir), "--input", str(dev_src),
                     "--output", str(output)]) == 0
    line = capsys.readouterr().err
    assert f"alpha {saved['alpha']} [run]" in line and "averaged.keras" in line
    assert "chosen by keras-transformer tune on the first 12 sentences" in line
    given = Decoder.resolve(run, {name: saved[name] for name in (
        "beam_size", "alpha", "no_repeat_ngram_size", "repetition_penalty")})
    expected = given.engine().translate(dev_src.read_text(encoding="utf-8").splitlines())
    assert output.read_text(encoding="utf-8").splitlines() == expected
    # The evaluate stage too (the run's own dev split here).
    scores = stages.evaluate(run, split="dev")
    assert (run_dir / "hyp.dev.beam4.txt").read_text(encoding="utf-8").splitlines() == expected
    assert set(scores) >= {"sacrebleu", "chrf"}

    # Training again with nothing to train leaves the choice as it is, and says so.
    assert cli.main(["train", "--output-dir", str(run_dir), "--verbose", "0"]) == 0
    assert "holds a choice made since the last training" in capsys.readouterr().out
    assert run.decoding() == {key: saved[key] for key in saved if key != "format_version"}


def test_tune_refuses_what_it_cannot_choose_on_naming_it(tiny_run, tmp_path, capsys):
    src, short = tmp_path / "dev.en", tmp_path / "short.de"
    src.write_text("a dog\nthe cat\n", encoding="utf-8")
    short.write_text("EIN HUND\n", encoding="utf-8")
    for flags, message in (
            (["--src", str(src)], "give both the dev sources and their references"),
            (["--src", str(src), "--ref", str(short)], f"{src} has 2 lines but {short} has 1"),
            (["--tgt-lang", "fr"], "this run translates into de, not 'fr'")):
        assert cli.main(["tune", "--run-dir", str(tiny_run), *flags]) == 2, flags
        assert message in capsys.readouterr().err, flags
    with pytest.raises(SystemExit):
        cli.main(["tune", "--run-dir", str(tiny_run), "--max-sentences", "-3"])
    assert "'-3' is not a number of sentences (0: all)" in capsys.readouterr().err
    with pytest.raises(RunError, match="has no trained model to tune: train it first"):
        stages.tune(tmp_path)


def test_a_run_without_dev_files_is_told_to_give_them(run_copy):
    run = Run(run_copy)
    config = run.config
    # The same run as if trained without --dev-src/--dev-tgt.
    document = json.loads(run.config_path.read_text(encoding="utf-8"))
    for section in document.values():
        if isinstance(section, dict) and "dev_src" in section:
            section.update(dev_src=None, dev_tgt=None)
    run.config_path.write_text(json.dumps(document), encoding="utf-8")
    with pytest.raises(InputError, match="the run has no dev set .* give dev sentences and "
                       r"their references \(--src and --ref\)"):
        stages.dev_set(Run(run_copy))
    dev = stages.dev_set(Run(run_copy), ["a dog", "the cat"], ["EIN HUND", "DIE KATZE"],
                         max_sentences=1)
    assert (dev.sources, dev.references) == (["a dog"], ["EIN HUND"])
    assert config.dev_src is not None


def test_the_tries_are_saved_with_the_choice_and_go_with_it(tmp_path):
    run = Run(tmp_path)
    tries = tuning.tries(
        {None: {"final weights": 20.5}},
        {"alpha": 1.0, "val_beam_sacrebleu_by_alpha": {"0.6": (21.0, 0.98), "1.0": (21.5, 1.0)},
         "val_beam_by_repetition": {"off": {"sacrebleu": 21.5, "stutters": 2,
                                            "no_repeat_ngram_size": 0,
                                            "repetition_penalty": 1.0}}}, 4)
    assert tries == [
        {"search": "greedy", "weights": "final weights", "sacrebleu": 20.5},
        {"search": "beam 4", "alpha": 0.6, "sacrebleu": 21.0, "brevity_penalty": 0.98},
        {"search": "beam 4", "alpha": 1.0, "sacrebleu": 21.5, "brevity_penalty": 1.0},
        {"search": "beam 4", "alpha": 1.0, "repetition": "off", "sacrebleu": 21.5,
         "stutters": 2, "no_repeat_ngram_size": 0, "repetition_penalty": 1.0}]
    Decoder.save_choice(run, alpha=1.0, chosen_by="a test", tries=tries)
    saved = json.loads(run.decoding_path.read_text(encoding="utf-8"))
    assert saved["format_version"] == 3 and saved["tries"] == tries
    # A later choice without tries (`average`, early stopping) takes the old ones away.
    Decoder.save_choice(run, weights="average of the last 5 checkpoints")
    saved = json.loads(run.decoding_path.read_text(encoding="utf-8"))
    assert "tries" not in saved and saved["alpha"] == 1.0 and saved["format_version"] == 1
    with pytest.raises(ValueError, match="tries must be a list of objects"):
        Decoder.save_choice(run, tries=[{"alpha": [1.0]}])
    run.decoding_path.write_text('{"format_version": 3, "tries": {"a": 1}}', encoding="utf-8")
    with pytest.raises(RunError, match="is damaged .*tries must be a list"):
        run.decoding()


@pytest.mark.slow  # multi_run trains a two-pair run (about 11 CPU-s), then four searches
def test_a_run_of_several_targets_is_tuned_on_every_pair_or_on_the_pair_named(
        multi_run, two_corpora, tmp_path, monkeypatch, capsys):
    import shutil

    from keras_transformer.errors import ConfigError
    from pipelines.multilingual import tagged

    run_dir = tmp_path / "run"
    shutil.copytree(multi_run[0], run_dir)
    run = Run(run_dir)
    own = stages.dev_set(run, max_sentences=3)
    fr, de = (stages.dev_set(run, target_language=lang, max_sentences=3) for lang in ("fr", "de"))
    assert own.sources == fr.sources + de.sources and own.references == fr.references + \
        de.references
    assert all(source.startswith(tagged("x", "fr")[:-1]) for source in fr.sources)
    assert own.described == "the run's dev set (en-fr, en-de: the first 3 sentences of each)"
    with pytest.raises(ConfigError, match=r"translates into fr, de: say which language the "
                       r"references are in \(--tgt-lang\)"):
        stages.dev_set(run, ["a dog"], ["EIN HUND"])
    given = stages.dev_set(run, ["a dog"], ["EIN HUND"], target_language="de")
    assert given.sources == [tagged("a dog", "de")] and given.described.endswith("(en-de)")

    _small_grid(monkeypatch)
    corpus = two_corpora["de"]
    assert cli.main(["tune", "--run-dir", str(run_dir), "--src", str(corpus["dev.src"]),
                     "--ref", str(corpus["dev.tgt"]), "--tgt-lang", "de",
                     "--max-sentences", "4"]) == 0
    choice = run.decoding()
    assert choice["chosen_by"].endswith("(en-de)") and len(choice["tries"]) == 5
    assert "dev (first 4 sentences, greedy): final weights" in capsys.readouterr().out
