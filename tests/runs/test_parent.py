"""Fine-tuning (`train --init-from`): a child run starts from its parent's weights, with its
architecture and vocabulary, and trains, resumes and averages as any run."""

import contextlib
import hashlib
import io
import json
import os
import pathlib
import shutil

import keras
import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer.errors import ConfigError, RunError
from keras_transformer.runs import Run, make_config
from keras_transformer.runs.parent import initialize, with_parent
from keras_transformer.training import train
from keras_transformer.training.callbacks import DevLoss
from keras_transformer.training.inputs import dev_data
from keras_transformer.training.loss import LabelSmoothedCrossEntropy
from tests.training_helpers import write_corpus


@pytest.fixture(scope="session")
def new_corpus(tmp_path_factory):
    """Other data for the same vocabulary: the target is the source in upper case, in the
    source's order (the parent learned to reverse it)."""
    return write_corpus(tmp_path_factory.mktemp("new-corpus"), pairs=300, seed=1,
                        target=str.upper)


def child_config(parent, corpus, output_dir, dev=None, **overrides):
    """A child of `parent` trained on `corpus` (its dev set, or `dev`'s): no architecture or
    vocabulary setting given, a schedule of its own."""
    dev = dev or corpus
    settings = dict(
        init_from=str(parent), dataset="text", train_src=str(corpus["train.src"]),
        train_tgt=str(corpus["train.tgt"]), dev_src=str(dev["dev.src"]),
        dev_tgt=str(dev["dev.tgt"]), tokens_per_batch=256, max_length=32, warmup_steps=10,
        lr_scale=1.0, train_steps=10, checkpoint_steps=10, eval_steps=10, verbose=0,
        precision="float32", output_dir=str(output_dir))
    return make_config(**{**settings, **overrides})


def dev_loss(run_dir, dev_of):
    """The dev loss of a run's model for decoding on the dev set of the run `dev_of`, as
    `train` reports it."""
    model, data = Run(run_dir), Run(dev_of)
    dev_loss = DevLoss(dev_data(data.config, data)[0],
                       LabelSmoothedCrossEntropy(data.config.label_smoothing))
    return dev_loss(model.load_model())["val_loss"]


@pytest.fixture(scope="module")
def child_run(tmp_path_factory, tiny_run, new_corpus):
    """A child trained once for the tests below: 30 steps on `new_corpus` (and its dev set)
    from a private copy of `tiny_run`. Returns (parent, child, summary, printed output)."""
    folder = tmp_path_factory.mktemp("fine-tuning")
    parent, child = folder / "parent", folder / "child"
    shutil.copytree(tiny_run, parent)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        summary = train(child_config(parent, new_corpus, child, train_steps=30))
    return parent, child, summary, out.getvalue()


@pytest.mark.slow  # the child: trains 30 steps (~10 s)
def test_a_child_starts_at_its_parents_dev_loss_and_keeps_its_vocabulary(child_run,
                                                                         new_corpus):
    parent_dir, child, summary, out = child_run
    assert "fine-tuning: starting from the weights of" in out
    # On the same dev set, the child's first dev loss is its parent's.
    assert summary["start_val_loss"] == pytest.approx(dev_loss(parent_dir, child), abs=1e-5)

    parent = Run(parent_dir)
    assert Run(child).vocabulary_bytes() == parent.vocabulary_bytes()
    # The new data were prepared with that vocabulary, and the cache keys them by it.
    cache = pathlib.Path(os.environ["KERAS_TRANSFORMER_DATA_CACHE"])
    own = {"sha256": hashlib.sha256(parent.vocabulary_bytes()).hexdigest()}
    assert any(manifest["vocabulary"] == own and str(new_corpus["train.src"].resolve())
               in json.dumps(manifest["source"])
               for manifest in map(json.loads, map(pathlib.Path.read_text,
                                                   cache.glob("*/manifest.json"))))
    saved = json.loads((child / "config.json").read_text())
    assert saved["parent"] == {
        "init_from": str(parent_dir), "parent_model": str(parent_dir / "model.keras"),
        "parent_config_sha256": hashlib.sha256(
            (parent_dir / "config.json").read_bytes()).hexdigest()}
    assert Run(child).config.architecture == parent.config.architecture
    assert saved["data"]["vocab_size"] == parent.config.vocab_size
    # Its own schedule: warmup and steps as asked, not the parent's (50 and 20).
    assert (saved["optimization"]["warmup_steps"], saved["optimization"]["train_steps"]) \
        == (10, 30)


@pytest.mark.slow  # the child (trains 30 steps, ~10 s)
def test_a_child_lowers_its_dev_loss_on_new_data(child_run):
    summary = child_run[2]
    assert summary["val_loss"] < summary["start_val_loss"] - 0.1, summary


@pytest.mark.slow  # the child, and 10 steps more on a copy of it (~15 s)
def test_a_child_resumes_as_its_own_run_without_its_parent(child_run, new_corpus, tmp_path,
                                                           capsys):
    # The same command again, further, with the parent moved away: how the child starts is
    # decided before training; it resumes from its own checkpoint, not the parent's weights,
    # and reads no file of its parent.
    parent, trained, _, _ = child_run
    child = tmp_path / "child"
    shutil.copytree(trained, child)
    moved = parent.rename(tmp_path / "moved-parent")
    try:
        capsys.readouterr()
        second = train(child_config(parent, new_corpus, child, train_steps=40))
        out = capsys.readouterr().out
        assert moved.is_dir() and not parent.exists()
    finally:
        moved.rename(parent)
    assert "resumed from" in out and "ckpt-30" in out and "starting from the weights" not in out
    assert (second["start_step"], second["step"]) == (30, 40)
    assert "start_val_loss" not in second
    assert cli.main(["average", "--run-dir", str(child), "--last", "2"]) == 0
    assert (child / "averaged.keras").is_file()


def test_architecture_and_vocabulary_settings_are_refused_by_name(tiny_run, toy_corpus,
                                                                  tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"d_model 64 \(the parent's: 32\)"):
        with_parent(child_config(tiny_run, toy_corpus, tmp_path / "c", d_model=64))
    with pytest.raises(ConfigError, match=r"num_layers 3 .*vocab_size 300"):
        with_parent(child_config(tiny_run, toy_corpus, tmp_path / "c", vocab_size=300,
                                 num_layers=3))
    # The parent's own value may be given; the rest of the recipe is the child's.
    config = with_parent(child_config(tiny_run, toy_corpus, tmp_path / "c", d_model=32,
                                      dropout=0.3))
    assert (config.d_model, config.dropout, config.num_layers) == (32, 0.3, 1)

    argv = ["train", "--init-from", str(tiny_run), "--dataset", "text", "--train-src",
            str(toy_corpus["train.src"]), "--train-tgt", str(toy_corpus["train.tgt"]),
            "--output-dir", str(tmp_path / "c"), "--num-heads", "2"]
    assert cli.main(argv) == 2
    error = capsys.readouterr().err
    assert "num_heads 2 (the parent's: 4)" in error and len(error.splitlines()) == 1
    assert not (tmp_path / "c").exists()


def test_init_from_names_what_is_wrong_with_the_parent(tiny_run, toy_corpus, tmp_path):
    for path, message in ((tmp_path / "nothing", "no such run directory"),
                          (toy_corpus["train.src"].parent, "not a training run directory"),
                          (tiny_run / "averaged.keras", "no such model file")):
        with pytest.raises(ConfigError, match=message):
            with_parent(child_config(path, toy_corpus, tmp_path / "c"))
    # A model file of the run is taken as it is.
    config = with_parent(child_config(tiny_run / "model.keras", toy_corpus, tmp_path / "c"))
    assert config.parent_model == str(tiny_run / "model.keras")


def test_a_mixed_precision_child_starts_from_the_parents_float32_weights(tiny_run, toy_corpus,
                                                                         tmp_path):
    config = with_parent(child_config(tiny_run, toy_corpus, tmp_path / "c"))
    parent = Run(tiny_run)
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        model = parent.build_model()  # the same architecture and vocabulary
    finally:
        keras.mixed_precision.set_global_policy(previous)
    initialize(model, config)
    expected = parent.load_model(path=tiny_run / "model.keras").weights
    assert all(v.dtype == "float32" for v in model.weights)
    for a, b in zip(expected, model.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a),
                                      keras.ops.convert_to_numpy(b))


def test_a_parent_changed_since_it_was_recorded_is_refused(run_copy, toy_corpus, tmp_path):
    config = with_parent(child_config(run_copy, toy_corpus, tmp_path / "c"))
    model = Run(run_copy).build_model()
    config_path = run_copy / "config.json"
    config_path.write_text(config_path.read_text() + "\n")  # say, retrained in place
    with pytest.raises(RunError, match="changed since this run recorded it as its parent"):
        initialize(model, config)
