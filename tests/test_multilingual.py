"""One model, several target languages (issue 52): the per-pair settings and their refusals,
the mixing of the pairs, training a tiny run of two pairs (en->fr, en->de on toy corpora the
tests write), decoding it with and without --tgt-lang, its SavedModel's `target_language`
input through a TF1 Session, and a one-pair run left as it was."""

import json
import pathlib
import sys
import textwrap

import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer.errors import ConfigError, InputError
from keras_transformer.runs import make_config
from pipelines import multilingual
from tests.conftest import RUNTIME_PRESET, run_decoder, run_engine, toy_config
from tests.training_helpers import run_python, write_corpus

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
SOURCES = ["the dog runs in the park", "", "a big red cat"]


def upper(sentence):
    return sentence.upper()


@pytest.fixture(scope="session")
def two_corpora(tmp_path_factory, toy_corpus):
    """en->fr: the toy corpus (reversed, upper case); en->de: a smaller one (upper case)."""
    other = write_corpus(tmp_path_factory.mktemp("toy-corpus-de"), pairs=200, seed=1,
                         target=upper)
    return {"fr": toy_corpus, "de": other}


def pair_settings(corpora, languages=("fr", "de")):
    return dict(tgt_lang=list(languages),
                train_src=[str(corpora[l]["train.src"]) for l in languages],
                train_tgt=[str(corpora[l]["train.tgt"]) for l in languages],
                dev_src=[str(corpora[l]["dev.src"]) for l in languages],
                dev_tgt=[str(corpora[l]["dev.tgt"]) for l in languages])


@pytest.fixture(scope="session")
def multi_run(tmp_path_factory, two_corpora, runtime_preset):
    """A run of two pairs trained to step 10 (dev BLEU at 10); its training summary."""
    from keras_transformer.training import train

    run_dir = tmp_path_factory.mktemp("multi-run") / "run"
    config = toy_config(two_corpora["fr"], run_dir, train_steps=10, bleu_steps=10,
                        bleu_sentences=8, **pair_settings(two_corpora))
    return run_dir, train(config)


# -- settings -----------------------------------------------------------------------------------

def test_one_value_lists_read_and_save_as_one_pair():
    config = make_config(tgt_lang=["fr"], src_lang=["en"])
    assert config.tgt_lang == "fr" and config.target_languages is None
    document = config.to_dict()["data"]
    assert document["tgt_lang"] == "fr" and "pair_sampling_temperature" not in document
    several = make_config(tgt_lang=["de", "fr", "cs"])
    assert [p.name for p in several.data.pairs()] == ["en-de", "en-fr", "en-cs"]
    assert several.to_dict()["data"]["tgt_lang"] == ["de", "fr", "cs"]


@pytest.mark.parametrize("settings, message", [
    (dict(tgt_lang=["de", "fr", "de"]), "the pair en-de is given twice"),
    (dict(tgt_lang=["de", "xx"]), "Multi30k has no language 'xx'"),
    (dict(src_lang=["en", "de", "fr"], tgt_lang=["de", "fr"]), "'src_lang' gives 3 languages"),
    (dict(dataset="text", train_src=["a.en", "b.en"], train_tgt=["a.de"],
          tgt_lang=["de", "fr"]), "'train_tgt' lists 1 file"),
    (dict(tgt_lang=["en", "fr"]), "must differ from src_lang"),
])
def test_pairs_that_do_not_make_sense_are_refused(settings, message):
    with pytest.raises(ConfigError, match=message):
        make_config(**settings)


def test_a_config_file_of_lists_of_different_lengths_is_refused_before_anything_is_written(
        tmp_path, capsys):
    config = tmp_path / "multi.yaml"
    config.write_text(textwrap.dedent("""
        data:
          dataset: text
          tgt_lang: [de, fr]
          train_src: [a.en, b.en]
          train_tgt: [a.de]
        run:
          output_dir: RUN
    """).replace("RUN", str(tmp_path / "run")), encoding="utf-8")
    assert cli.main(["train", "--config", str(config)]) == 2
    assert "'train_tgt' lists 1 file(s) ['a.de'] for 2 pairs" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert cli.main(["train", "--tgt-lang", "de", "fr", "de", "--output-dir",
                     str(tmp_path / "run")]) == 2
    assert "given twice" in capsys.readouterr().err and not (tmp_path / "run").exists()


# -- mixing ---------------------------------------------------------------------------------------

def test_pair_mixing_follows_the_temperature_and_keeps_every_pair():
    sizes = [9000, 1000]
    assert np.allclose(multilingual.pair_shares(sizes, 1.0), [0.9, 0.1])
    assert np.allclose(multilingual.pair_shares(sizes, 1e9), [0.5, 0.5])
    counts = multilingual.pair_counts(sizes, 5.0)
    assert counts[0] == 9000 and counts[1] > 1000  # the small pair upsampled, none dropped
    shares = np.array(counts) / sum(counts)
    assert np.allclose(shares, multilingual.pair_shares(sizes, 5.0), atol=1e-3)
    order = multilingual.pair_order(counts, seed=3)
    assert np.array_equal(order, multilingual.pair_order(counts, seed=3))  # resumable
    assert np.bincount(order).tolist() == counts
    assert multilingual.untag_alignment("0-0 1-1 3-2") == "0-1 2-2"


# -- training and decoding a run of two pairs -------------------------------------------------------

@pytest.mark.slow  # multi_run trains a two-pair run (about 11 CPU-s): `make test` only
def test_training_reports_each_pair_and_their_mean(multi_run):
    run_dir, summary = multi_run
    for name in ("en-fr", "en-de"):
        assert f"{name}/val_loss" in summary
    mean = (summary["en-fr/val_loss"] + summary["en-de/val_loss"]) / 2
    assert summary["val_loss"] == pytest.approx(mean)
    saved = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))["data"]
    assert saved["tgt_lang"] == ["fr", "de"] and saved["pair_sampling_temperature"] == 5.0
    from keras_transformer.runs import open_run

    pieces = open_run(run_dir).vocabulary().pieces()
    assert "\u2581<2fr>" in pieces and "\u2581<2de>" in pieces  # the tags: reserved pieces
    from tests.test_tensorboard import read_events

    dev = read_events(run_dir / "logs" / "dev")
    for tag in ("loss", "bleu", "chrf", "en-fr/loss", "en-de/loss", "en-fr/bleu",
                "en-de/chrf", "en-fr/perplexity"):
        assert [step for step, _ in dev[tag]] == [10], tag
    assert dev["loss"][0][1] == pytest.approx(mean)


@pytest.mark.slow  # multi_run trains a two-pair run (about 11 CPU-s): `make test` only
def test_translate_needs_a_target_and_names_the_choices(multi_run, capsys, tmp_path,
                                                         monkeypatch):
    run_dir, _ = multi_run
    source = tmp_path / "in.txt"
    source.write_text("the dog runs\n", encoding="utf-8")
    output = tmp_path / "out.txt"
    common = ["translate", "--run-dir", str(run_dir), "--input", str(source), "--output",
              str(output), "--beam", "1"]
    assert cli.main(common) == 2
    assert "translates into fr, de: say which with --tgt-lang" in capsys.readouterr().err
    assert cli.main(common + ["--tgt-lang", "cs"]) == 2
    assert "--tgt-lang 'cs': this model translates into fr, de" in \
        capsys.readouterr().err
    assert not output.exists()
    assert cli.main(common + ["--tgt-lang", "de"]) == 0 and output.is_file()


@pytest.mark.slow  # multi_run trains a two-pair run (about 11 CPU-s): `make test` only
def test_the_python_api_translates_into_the_language_asked(multi_run):
    run_dir, _ = multi_run
    translator = run_engine(run_dir, "evaluate", beam_size=1, precision="float32")
    with pytest.raises(InputError, match="translates into fr, de"):
        translator.translate(SOURCES)
    french = translator.translate(SOURCES, nbest=True, target_language="fr")
    german = translator.translate(SOURCES, nbest=True, target_language="de")
    mixed = translator.translate(SOURCES, nbest=True, target_language=["fr", "de", "de"])
    assert french[0][0][1] != german[0][0][1]  # the tag changes what the model reads
    assert mixed[0] == french[0] and mixed[2] == german[2] and mixed[1] == [("", 0.0)]
    scores = translator.score(["the dog runs"], ["DOG"], target_language="fr")
    assert scores[0]["tokens"] > 0


@pytest.mark.slow  # multi_run trains a two-pair run (about 11 CPU-s): `make test` only
def test_evaluate_scores_every_pair_in_one_table(multi_run, capsys):
    run_dir, _ = multi_run
    assert cli.main(["evaluate", "--run-dir", str(run_dir), "--split", "dev", "--beam",
                     "1"]) == 0
    out = capsys.readouterr().out
    assert "text dev en-fr" in out and "text dev en-de" in out and "sacreBLEU" in out
    assert (run_dir / "hyp.dev.beam1.fr.txt").is_file()
    assert (run_dir / "hyp.dev.beam1.de.txt").is_file()


@pytest.mark.slow  # loads tiny_run and traces its greedy search (12 CPU-s)
def test_a_one_pair_run_takes_its_own_target_only(toy_translators):
    translator = toy_translators[1]  # run_engine(tiny_run, beam_size=1, precision="float32")
    plain = translator.translate(SOURCES)
    assert translator.translate(SOURCES, target_language="de") == plain  # no tag
    with pytest.raises(InputError, match="translates into de only"):
        translator.translate(SOURCES, target_language="fr")


# The SavedModel as TensorFlow Serving runs it: a TF1 Session, defaults from the SignatureDef.
FRESH_PROCESS = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    tf.compat.v1.disable_eager_execution()
    benchmarks, directory, output = sys.argv[1:4]
    sys.path.insert(0, benchmarks)
    from tf_serving import PredictError, PredictHandler

    handler = PredictHandler(directory)
    sentences = %r
    answers = {}
    for key, inputs in (("default", {"sentences": sentences}),
                        ("mixed", {"sentences": sentences, "target_language": ["fr", "de", "de"]}),
                        ("fr", {"sentences": sentences, "target_language": ["fr"]}),
                        ("de", {"sentences": sentences, "target_language": ["de"]})):
        answers[key] = handler.predict(inputs, "translate_nbest")["scores"].tolist()
    try:
        # translate_nbest, whose Session executor the requests above built (a first request
        # to serving_default would optimize a second graph: 16 of the child's 48 CPU-s).
        handler.predict({"sentences": sentences, "target_language": ["cs"]}, "translate_nbest")
        answers["unknown"] = "served"
    except Exception as error:
        answers["unknown"] = str(error)
    json.dump(answers, open(output, "w"))
""") % (SOURCES,)


def test_the_target_language_input_through_a_tf1_session(tmp_path):
    """The input's graph (`export.languages`) in a SavedModel of its own, served as TensorFlow
    Serving does: absent, it is the SignatureDef's default (the first target)."""
    import tensorflow as tf

    from keras_transformer.export import languages as graph

    sys.path.insert(0, str(BENCHMARKS))
    from tf_serving import PredictHandler

    class Tagger(tf.Module):
        languages = ("fr", "de")

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string),
                                      graph.TARGET_LANGUAGE])
        def tag(self, sentences, target_language=tf.constant(["fr"])):
            tagged = graph.tagged_sentences(self, sentences, target_language)
            return {"tagged": tagged, "untagged": graph.untag_alignments(
                tf.constant(["0-0 1-1 2-0", "", "0-3"]))}

    module = Tagger()
    tf.saved_model.save(module, str(tmp_path / "tagger"),
                        signatures={"serving_default": module.tag})
    handler = PredictHandler(tmp_path / "tagger")

    def tagged(**inputs):
        return [t.decode() for t in handler.predict({"sentences": SOURCES, **inputs})["tagged"]]

    assert tagged() == ["<2fr> the dog runs in the park", "", "<2fr> a big red cat"]
    assert tagged(target_language=["de", "fr", "de"])[2] == "<2de> a big red cat"
    assert handler.predict({"sentences": SOURCES})["untagged"].tolist() == [b"0-1 1-0", b"", b""]
    with pytest.raises(tf.errors.InvalidArgumentError, match="one of fr, de"):
        tagged(target_language=["cs"])
    with pytest.raises(tf.errors.InvalidArgumentError, match="one language per sentence"):
        tagged(target_language=["fr", "de"])


@pytest.mark.slow  # the export alone takes about 17 s of CPU (every signature traced)
def test_the_saved_model_serves_a_request_that_mixes_languages(multi_run, tmp_path):
    from keras_transformer import export

    run_dir, _ = multi_run
    saved = export.export_run(run_decoder(run_dir, beam_size=2), output_dir=tmp_path,
                              name="multi")
    result = run_python("-c", FRESH_PROCESS, str(BENCHMARKS), str(saved),
                        str(tmp_path / "answers.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    answers = json.loads((tmp_path / "answers.json").read_text())
    assert answers["default"] == answers["fr"]  # the first target
    assert answers["mixed"][0] == answers["fr"][0] and answers["mixed"][2] == answers["de"][2]
    assert answers["fr"][0] != answers["de"][0]
    assert "target_language must be one of fr, de" in answers["unknown"]


@pytest.mark.slow  # a CTranslate2 export and eight scorers (test_ctranslate2.py keeps one fast)
def test_the_ctranslate2_export_scores_every_pair_as_the_keras_engine(multi_run, tmp_path):
    pytest.importorskip("ctranslate2")
    from keras_transformer import export
    from keras_transformer.decoding.decoder import Decoder
    from keras_transformer.runs import open_run

    run_dir, _ = multi_run
    folder = export.export_run(run_decoder(run_dir), format="ctranslate2", quantize="none",
                               output_dir=tmp_path, name="m")  # float32: scores to 1e-3
    run, sources, targets = open_run(run_dir), SOURCES[::2], ["PARK THE DOG", "A CAT"]
    scores = {}
    for language in ("fr", "de"):
        for engine in ("tensorflow", "ctranslate2"):
            given = ({"precision": "float32"} if engine == "tensorflow"
                     else {"ctranslate2_model": str(folder)})
            given.update(target_language=language, engine=engine)
            decoder = Decoder.resolve(run, given, command="score")
            scores[language, engine] = [r["log_prob"] for r in
                                        decoder.engine().score(sources, targets)]
        assert scores[language, "ctranslate2"] == pytest.approx(
            scores[language, "tensorflow"], abs=1e-3)
    assert scores["fr", "tensorflow"] != scores["de", "tensorflow"]


def test_the_mixed_corpus_is_the_same_each_time_it_is_prepared(two_corpora, tmp_path):
    """The mixing is part of the prepared data (its key: the pairs, temperature and seed), so
    the batch stream and its resumable data position are those of one corpus."""
    from pipelines import datasets

    config = make_config(dataset="text", vocab_size=400, max_length=32,
                         pair_sampling_temperature=2.0, **pair_settings(two_corpora))
    arguments = config.prepared_data_arguments()
    prepared = [datasets.prepare_training_data(
        "text", **dict(arguments, cache_dir=tmp_path / name), progress=False)
        for name in ("a", "b")]
    first, second = (data.statistics for data in prepared)
    assert [s["sha256"] for s in first["shards"]] == [s["sha256"] for s in second["shards"]]
    assert prepared[0].directory.name.startswith("text-en-fr+de-")
    other = datasets.prepare_training_data(
        "text", **dict(arguments, cache_dir=tmp_path / "a", pair_sampling_temperature=1.0),
        progress=False)
    assert other.directory != prepared[0].directory  # another temperature: other data


@pytest.mark.slow  # multi_run trains a two-pair run (about 11 CPU-s): `make test` only
def test_a_student_learns_one_pair_of_a_teacher_of_several(multi_run, two_corpora, tmp_path,
                                                            capsys, monkeypatch):
    """The teacher translates that pair's training sources into its language; the student is
    a one-pair run of them (its training itself is the distillation tests' concern)."""
    from keras_transformer.training import trainer

    run_dir, _ = multi_run
    student = tmp_path / "student"
    flags = ["distill", "--teacher", str(run_dir), "--output-dir", str(student), "--preset",
             RUNTIME_PRESET, "--beam", "1", "--teacher-precision", "float32", "--verbose", "0",
             "--no-tune"]
    assert cli.main(flags) == 2
    assert "translates into fr, de: name the pair" in capsys.readouterr().err
    assert cli.main(flags + ["--tgt-lang", "cs"]) == 2
    assert "--tgt-lang 'cs': the teacher translates into fr, de" in capsys.readouterr().err
    assert not student.exists()
    trained = []
    monkeypatch.setattr(trainer, "train", lambda config, **_: trained.append(config) or {})
    assert cli.main(flags + ["--tgt-lang", "de"]) == 0, capsys.readouterr().err
    config = trained[0]
    assert (config.src_lang, config.tgt_lang, config.target_languages) == ("en", "de", None)
    sources = pathlib.Path(config.train_src).read_text(encoding="utf-8").splitlines()
    expected = two_corpora["de"]["train.src"].read_text(encoding="utf-8").splitlines()
    assert sources == expected
    assert len(pathlib.Path(config.train_tgt).read_text(encoding="utf-8").splitlines()) == \
        len(expected)


def test_the_multilingual_demo_has_the_compute_of_one_bilingual_demo_per_pair(capsys):
    from keras_transformer.tasks import main_job

    recipe = main_job.recipe(tgt_lang=["de", "fr", "cs"])
    assert recipe["train_steps"] == 3 * main_job.QUICK["train_steps"]
    assert recipe["checkpoint_steps"] == 3 * main_job.QUICK["checkpoint_steps"]
    assert recipe["tgt_lang"] == ["de", "fr", "cs"]
    assert cli.main(["demo", "--tgt-lang", "de", "fr", "de"]) == 2
    assert "given twice" in capsys.readouterr().err
    table = main_job.pair_table({"fr": dict(sacrebleu=40.0, chrf=60.0, literature_bleu=41.0,
                                            wrong_language=0.004)})
    assert "fr" in table and "0.40%" in table


@pytest.mark.slow  # a CTranslate2 export and four searches per pair
def test_the_benchmark_compares_the_ctranslate2_export_with_the_keras_engine(multi_run, tmp_path,
                                                                              capsys):
    pytest.importorskip("ctranslate2")
    import importlib.util

    run_dir, _ = multi_run
    (tmp_path / "multilingual").symlink_to(run_dir)
    spec = importlib.util.spec_from_file_location("multilingual_benchmark",
                                                  BENCHMARKS / "multilingual.py")
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    capsys.readouterr()
    benchmark.export_agreement(tmp_path, ["fr", "de"], 4, "test cpu")
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["pair"] for line in lines] == ["en-fr", "en-de"]
    for line in lines:
        assert line["sentences"] == 4
        assert line["greedy_identical"] == 1.0  # the export's documented tolerance
        # Beam search may differ (CTranslate2 stops by its own rule): a share of the sentences.
        assert line["beam_identical"] in {k / 4 for k in range(5)}
