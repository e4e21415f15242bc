"""An ensemble of Transformers decoded as one model: the mean of the members' next-token
probabilities at every step, through the same searches, run directories and exports."""

import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer
from keras_transformer.decoding.search.beam_search import compiled_beam_search
from keras_transformer.decoding.search.greedy import compiled_greedy_search
from keras_transformer.errors import InputError, RunError
from keras_transformer.models import Ensemble
from keras_transformer.runs import EnsembleRun, Run, make_config, open_run
from keras_transformer.tasks import main_job
from pipelines.special_ids import EOS_ID
from pipelines.vocabulary import train_vocabulary
from tests.conftest import run_engine
from tests.test_search import hypotheses, sources

VOCAB = 40


def _model(seed, **overrides):
    keras.utils.set_random_seed(seed)
    model = Transformer.from_preset("tiny", vocab_size=VOCAB, dropout=0.0, **overrides)
    model.build()
    return model


@pytest.fixture(scope="module")
def members():
    return [_model(1), _model(2, num_layers=1)]


def test_the_ensemble_gives_the_log_of_its_members_mean_probability(members):
    src = sources()
    tgt = np.concatenate([np.full((3, 1), 1, "int32"), src[:, :4]], axis=1)
    ensemble = Ensemble(members)
    assert ensemble.count_params() == sum(member.count_params() for member in members)
    got = keras.ops.convert_to_numpy(ensemble((src, tgt)))
    probabilities = [tf.nn.softmax(member((src, tgt)), axis=-1).numpy() for member in members]
    np.testing.assert_allclose(got, np.log(np.mean(probabilities, axis=0)), atol=1e-5)


def test_the_cached_ensemble_search_matches_recomputing_every_prefix(members):
    src = sources(seed=3)
    ensemble = Ensemble(members)
    cached = compiled_greedy_search(ensemble)(src)
    uncached = compiled_greedy_search(ensemble, cached=False)(src)
    assert hypotheses(cached[0]) == hypotheses(uncached[0])
    np.testing.assert_allclose(cached[1], uncached[1], atol=1e-4)


@pytest.mark.slow  # two beam searches traced
def test_an_ensemble_of_one_model_decodes_as_that_model(members):
    src = sources(seed=5)
    alone, ensemble = members[0], Ensemble(members[:1])
    ours = compiled_beam_search(ensemble, beam_size=2)(src)
    theirs = compiled_beam_search(alone, beam_size=2)(src)
    assert hypotheses(ours["ids"][:, 0]) == hypotheses(theirs["ids"][:, 0])
    assert all(h[-1] == EOS_ID for h in hypotheses(ours["ids"][:, 0]))


def test_members_with_different_output_sizes_are_refused():
    with pytest.raises(InputError, match=r"output sizes differ: \[40, 41\]"):
        Ensemble([_model(1), Transformer.from_preset("tiny", vocab_size=41)])


@pytest.mark.slow
def test_a_directory_of_member_runs_translates_as_one_and_checks_the_vocabulary(tiny_run,
                                                                                 tmp_path):
    folder = tmp_path / "ensemble"
    for name in ("a", "b"):
        shutil.copytree(tiny_run, folder / "members" / name)
    run = open_run(folder)
    assert isinstance(run, EnsembleRun) and not isinstance(open_run(tiny_run), EnsembleRun)
    assert isinstance(run.load_model(), Ensemble) and run.config.max_length > 0
    sentences = ["a b c", "d e"]
    together = run_engine(folder, beam_size=2).translate(sentences)
    # Two copies of one model: their mean is that model.
    assert together == run_engine(tiny_run, beam_size=2).translate(sentences)

    # The command line takes the directory as any run: evaluate writes into it.
    from keras_transformer import cli

    source, reference = tmp_path / "src.txt", tmp_path / "ref.txt"
    source.write_text("a b c\nd e\n", encoding="utf-8")
    reference.write_text("a b c\nd e\n", encoding="utf-8")
    assert cli.main(["evaluate", "--run-dir", str(folder), "--src", str(source), "--ref",
                     str(reference), "--beam", "2"]) == 0
    assert run.hypotheses_path("test", 2).read_text(encoding="utf-8").splitlines() == together
    for refused in (["export", "--format", "tflite", "--output-dir", str(tmp_path)],
                    ["average", "--last", "2"]):
        assert cli.main([refused[0], "--run-dir", str(folder), *refused[1:]]) == 2

    other = train_vocabulary(["x y z w", "v u t s"] * 20, vocab_size=275, progress=False)
    (folder / "members" / "b" / Run.VOCABULARY / "spm.model").write_bytes(other.model_proto)
    with pytest.raises(RunError, match=r"members/b has another vocabulary"):
        open_run(folder).vocabulary()


def test_the_main_job_names_what_a_reused_member_was_trained_differently(tiny_run):
    (name, settings), = [m for m in main_job.members(True, "de") if m[0] == "l2-d0.1"]
    config = make_config(None, output_dir=str(tiny_run), **settings)
    with pytest.raises(RunError, match=r"other settings: train_steps 20 \(the recipe: 5500\)"):
        main_job._check_member(Run(tiny_run), config)


def test_the_full_recipe_is_an_ensemble_for_en_de_and_one_model_otherwise():
    full_de = main_job.members(True, "de")
    assert [name for name, _ in full_de] == ["l3-d0.3", "l3-d0.2", "l2-d0.1"]
    assert {s["dropout"] for _, s in full_de} == {0.3, 0.2, 0.1}
    assert all(s["train_steps"] == main_job.FULL["train_steps"] for _, s in full_de)
    assert main_job.members(True, "fr") == [(None, main_job.recipe(True, "fr"))]
    assert main_job.members() == [(None, main_job.recipe())]


def test_the_ensemble_owns_its_member_layout_and_keeps_its_decoding_choices(tmp_path):
    folder = tmp_path / "ensemble"
    assert EnsembleRun.member_directory(folder, "l3-d0.3") == folder / "members" / "l3-d0.3"
    for bad in ("", "..", "a/b"):
        with pytest.raises(ValueError, match="is not a member name"):
            EnsembleRun.member_directory(folder, bad)
    members = [Run(EnsembleRun.member_directory(folder, name)) for name in ("a", "b")]
    run = EnsembleRun(folder, members)
    members[0].save_decoding(model="model.keras", beam_size=2)
    choices = run.save_decoding(weights="each member's average of its last 5 checkpoints",
                                beam_size=4, alpha=1.0, chosen_by="the main job, on val")
    assert "model" not in choices and run.decoding() == choices
    assert (folder / "decoding.json").is_file() and Run(folder).decoding() == choices
    assert members[0].decoding() == {"model": "model.keras", "beam_size": 2}  # its own
    assert run.decoding_model_path() is None  # load_model takes each member's file
    with pytest.raises(RunError, match="is an ensemble: it has no single model file"):
        run.save_decoding(model="averaged.keras")
    assert run.save_decoding(model=None, alpha=0.6)["alpha"] == 0.6
