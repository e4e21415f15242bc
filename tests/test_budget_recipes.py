"""The run settings for training on a fixed budget: the learning-rate schedules that decay to 0
at the last step, gradient clipping, pre-norm, and the moving average of the weights. Each is a
setting of the run (a flag, saved, kept on resume) that reaches the optimizer or the model."""

import argparse
import json
import math

import keras
import numpy as np
import pytest

from keras_transformer import Transformer
from keras_transformer.errors import ConfigError
from keras_transformer.runs import Run
from keras_transformer.runs.config import TrainConfig, make_config
from keras_transformer.runs.sections import LR_SCHEDULES
from keras_transformer.training.optimizer import (AveragingAdam, FusedAdam, averaged_weights,
                                                  paper_optimizer, run_optimizer)
from keras_transformer.training.schedule import (DECAYS, SCHEDULES, TransformerSchedule,
                                                 WarmupCosineDecay, WarmupLinearDecay,
                                                 WarmupStableDecay, make_schedule, paper_peak)

PEAK, WARMUP, TOTAL = 2e-3, 100, 1200


def rate(schedule, step):
    return float(schedule(step))


# -- the schedules -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(DECAYS))
def test_decaying_schedules_warm_up_to_the_peak_and_reach_zero_at_the_last_step(name):
    schedule = make_schedule(name, 256, WARMUP, TOTAL, peak_lr=PEAK)
    assert rate(schedule, 0) == rate(schedule, 1) == pytest.approx(PEAK / WARMUP)
    assert rate(schedule, WARMUP // 2) == pytest.approx(PEAK / 2)
    assert rate(schedule, WARMUP) == pytest.approx(PEAK)
    assert rate(schedule, TOTAL - 1) < PEAK / 200  # the last update (Keras passes step 1199)
    assert rate(schedule, TOTAL) == rate(schedule, TOTAL + 500) == 0.0
    rates = [rate(schedule, step) for step in range(WARMUP, TOTAL + 1, 50)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))  # never rises after the warmup


def test_linear_and_cosine_decay_by_their_formulas():
    linear = WarmupLinearDecay(PEAK, WARMUP, TOTAL)
    cosine = WarmupCosineDecay(PEAK, WARMUP, TOTAL)
    for step in (100, 375, 650, 925, 1150):
        progress = (step - WARMUP) / (TOTAL - WARMUP)
        assert rate(linear, step) == pytest.approx(PEAK * (1 - progress), rel=1e-5)
        assert rate(cosine, step) == pytest.approx(
            PEAK * (1 + math.cos(math.pi * progress)) / 2, rel=1e-5, abs=1e-9)


def test_warmup_stable_decay_holds_the_peak_then_cools_down_over_the_last_fraction():
    schedule = WarmupStableDecay(PEAK, WARMUP, TOTAL, cooldown_fraction=0.25)
    assert schedule.cooldown_start == 900
    for step in (WARMUP, 500, 899, 900):
        assert rate(schedule, step) == pytest.approx(PEAK)
    assert rate(schedule, 1050) == pytest.approx(PEAK / 2)
    assert rate(schedule, 1125) == pytest.approx(PEAK / 4)
    assert rate(schedule, TOTAL) == 0.0
    # A cooldown longer than what follows the warmup starts when the warmup ends.
    whole = WarmupStableDecay(PEAK, WARMUP, TOTAL, cooldown_fraction=1.0)
    assert whole.cooldown_start == WARMUP
    assert rate(whole, 650) == pytest.approx(rate(WarmupLinearDecay(PEAK, WARMUP, TOTAL), 650))


@pytest.mark.parametrize("schedule", [
    TransformerSchedule(256, 800, scale=1.5), WarmupLinearDecay(PEAK, WARMUP, TOTAL),
    WarmupCosineDecay(PEAK, WARMUP, TOTAL), WarmupStableDecay(PEAK, WARMUP, TOTAL, 0.1)],
    ids=lambda schedule: type(schedule).__name__)
def test_schedules_round_trip_through_keras_serialization(schedule):
    clone = keras.optimizers.schedules.deserialize(
        json.loads(json.dumps(keras.optimizers.schedules.serialize(schedule))))
    assert type(clone) is type(schedule) and clone.get_config() == schedule.get_config()
    for step in (0, 50, 700, 1000, 1300):
        assert rate(clone, step) == rate(schedule, step)
    # Inside a compiled optimizer's config, as model.keras holds it.
    optimizer = keras.optimizers.deserialize(keras.optimizers.serialize(
        paper_optimizer(256, schedule=schedule, clip_norm=1.0, ema_momentum=0.99)))
    assert optimizer._learning_rate.get_config() == schedule.get_config()
    assert (optimizer.global_clipnorm, optimizer.use_ema, optimizer.ema_momentum) \
        == (1.0, True, 0.99)


def test_bad_schedule_arguments_are_named():
    with pytest.raises(ValueError, match="warmup_steps=1200 must be positive and fewer than "
                                         "total_steps=1200"):
        WarmupCosineDecay(PEAK, 1200, 1200)
    with pytest.raises(ValueError, match="cooldown_fraction=0"):
        WarmupStableDecay(PEAK, WARMUP, TOTAL, cooldown_fraction=0)
    with pytest.raises(ValueError, match="give train_steps"):
        make_schedule("cosine", 256, WARMUP)


def test_the_default_schedule_is_the_papers_and_peak_lr_sets_any_schedules_peak():
    assert set(SCHEDULES) == set(LR_SCHEDULES)  # the setting's values, each built here
    default = make_schedule("inverse_sqrt", 256, 800, 1200)
    assert default.get_config() == TransformerSchedule(256, 800).get_config()
    assert rate(default, 800) == rate(TransformerSchedule(256, 800), 800)
    # lr_scale multiplies every schedule; peak_lr (else the paper's peak) is before it.
    assert rate(make_schedule("inverse_sqrt", 256, 800, peak_lr=1e-3, lr_scale=2.0), 800) \
        == pytest.approx(2e-3)
    assert rate(make_schedule("linear", 256, 100, 1200, lr_scale=2.0), 100) \
        == pytest.approx(2 * paper_peak(256, 100))
    assert paper_peak(256, 800) == pytest.approx(rate(TransformerSchedule(256, 800), 800))


# -- the settings ------------------------------------------------------------------------------
NEW_KEYS = ("lr_schedule", "peak_lr", "cooldown_fraction", "clip_norm", "ema_momentum")


def train_help():
    from keras_transformer.cli import train as train_command

    parser = argparse.ArgumentParser(prog="keras-transformer")
    train_command.register(parser.add_subparsers(dest="command"), config_class=TrainConfig)
    return parser._subparsers._group_actions[0].choices["train"]


def test_the_settings_are_train_flags_and_the_defaults_leave_config_json_as_it_was():
    from keras_transformer.tasks.main_job import QUICK

    parser = train_help()
    text = " ".join(parser.format_help().split())
    for flag in ("--lr-schedule {inverse_sqrt,linear,cosine,wsd}", "--peak-lr PEAK_LR",
                 "--cooldown-fraction COOLDOWN_FRACTION", "--clip-norm CLIP_NORM",
                 "--ema-momentum EMA_MOMENTUM", "--norm-first, --no-norm-first"):
        assert flag in text, flag
    assert "cannot change them when it resumes" in text  # --train-steps says it
    # The demo's recipe: the paper's schedule, no clipping, no average, config.json unchanged.
    config = make_config(output_dir="runs/x", **QUICK).resolved()
    optimization = config.to_dict()["optimization"]
    assert not set(NEW_KEYS) & set(optimization), optimization
    assert (config.lr_schedule, config.clip_norm, config.ema_momentum) \
        == ("inverse_sqrt", None, None)
    given = parser.parse_args(["--lr-schedule", "wsd", "--clip-norm", "1", "--ema-momentum",
                               "0.999", "--peak-lr", "3e-3", "--cooldown-fraction", "0.2"])
    assert TrainConfig.given(given) == dict(lr_schedule="wsd", clip_norm=1.0,
                                            ema_momentum=0.999, peak_lr=3e-3,
                                            cooldown_fraction=0.2)


def test_a_schedule_is_saved_in_the_run_and_kept_on_resume(tmp_path):
    config = make_config(preset="tiny", output_dir=str(tmp_path), lr_schedule="wsd",
                         warmup_steps=10, train_steps=100, clip_norm=0.5,
                         ema_momentum=0.99).resolved()
    assert config.cooldown_fraction == 0.25  # wsd's default, filled and saved
    document = json.loads(json.dumps(config.to_dict()))
    assert {key: document["optimization"].get(key) for key in NEW_KEYS} == dict(
        lr_schedule="wsd", peak_lr=None, cooldown_fraction=0.25, clip_norm=0.5,
        ema_momentum=0.99)
    assert "peak_lr" not in document["optimization"]  # unset: not written
    saved = TrainConfig.from_document(document, "config.json")
    # Resumed by the same command without the flags: the run's own settings.
    resumed = saved.continued(make_config(origin="flag", output_dir=str(tmp_path)))
    assert (resumed.lr_schedule, resumed.cooldown_fraction, resumed.clip_norm,
            resumed.ema_momentum, resumed.train_steps) == ("wsd", 0.25, 0.5, 0.99, 100)
    for change, named in ((dict(lr_schedule="cosine"), "lr_schedule: 'wsd' -> 'cosine'"),
                          (dict(ema_momentum=0.9), "ema_momentum: 0.99 -> 0.9"),
                          (dict(clip_norm=1.0), "clip_norm: 0.5 -> 1.0")):
        with pytest.raises(ConfigError, match=named):
            saved.continued(make_config(origin="flag", **change))
    # The decay ends at train_steps: a resumed run may not move it.
    with pytest.raises(ConfigError, match=r"decays to 0 at train_steps=100; resuming it with "
                                          r"train_steps=150 would change its schedule"):
        saved.continued(make_config(origin="flag", train_steps=150))
    # The paper's schedule does not depend on train_steps: those may change.
    paper = make_config(preset="tiny", train_steps=100).resolved()
    assert paper.continued(make_config(origin="flag", train_steps=150)).train_steps == 150


def test_schedule_settings_that_cannot_work_are_refused_by_name():
    with pytest.raises(ConfigError, match="warmup_steps=100 must be fewer"):
        make_config(preset="tiny", lr_schedule="cosine", warmup_steps=100, train_steps=100)
    with pytest.raises(ConfigError, match="warmup_steps=1000 must be fewer"):  # the preset's
        make_config(preset="tiny", lr_schedule="linear", warmup_steps=1000).resolved()
    with pytest.raises(ConfigError, match="'cooldown_fraction' is a setting of lr_schedule"):
        make_config(lr_schedule="cosine", cooldown_fraction=0.2)
    with pytest.raises(ConfigError, match=r"'cooldown_fraction' must be in \(0, 1\]"):
        make_config(lr_schedule="wsd", cooldown_fraction=0.0)
    with pytest.raises(ConfigError, match=r"'ema_momentum' must be in \(0, 1\)"):
        make_config(ema_momentum=1.0)
    with pytest.raises(ConfigError, match="'lr_schedule' must be one of inverse_sqrt"):
        make_config(lr_schedule="step")


def test_the_run_settings_reach_the_optimizer():
    config = make_config(preset="tiny", lr_schedule="cosine", warmup_steps=10, train_steps=50,
                         peak_lr=1e-3, lr_scale=0.5, clip_norm=2.0, ema_momentum=0.9,
                         grad_accum_steps=2).resolved()
    optimizer = run_optimizer(64, config.optimization)
    schedule = optimizer._learning_rate
    assert isinstance(schedule, WarmupCosineDecay)
    assert (schedule.peak_learning_rate, schedule.warmup_steps, schedule.total_steps) \
        == (5e-4, 10, 50)
    assert (optimizer.global_clipnorm, optimizer.use_ema, optimizer.ema_momentum,
            optimizer.gradient_accumulation_steps) == (2.0, True, 0.9, 2)
    default = run_optimizer(64, make_config(preset="tiny").resolved().optimization)
    assert type(default) is FusedAdam and default.global_clipnorm is None
    assert not default.use_ema
    assert default._learning_rate.get_config() == TransformerSchedule(64, 100).get_config()


@pytest.mark.parametrize("fused", [True, False])
def test_gradients_are_clipped_to_the_global_norm(fused):
    """Adam's first moment after one update is (1 - beta_1) * the gradient it was given."""
    variables = [keras.Variable(np.zeros(2, "float32")), keras.Variable(np.zeros(1, "float32"))]
    gradients = [np.array([30.0, 0.0], "float32"), np.array([40.0], "float32")]  # norm 50
    for clip_norm, scale in ((None, 1.0), (5.0, 0.1)):
        optimizer = paper_optimizer(8, warmup_steps=5, fused=fused, clip_norm=clip_norm)
        optimizer.build(variables)
        optimizer.apply(gradients, variables)
        moments = [optimizer._momentums[i].numpy() for i in range(2)]
        for moment, gradient in zip(moments, gradients):
            np.testing.assert_allclose(moment, 0.1 * scale * gradient, rtol=1e-6)


def test_pre_norm_reaches_every_layer_and_adds_the_final_layer_norms():
    given = TrainConfig.given(train_help().parse_args(["--preset", "tiny", "--norm-first"]))
    config = make_config(origin="flag", **given).resolved()
    assert config.norm_first is True and config.to_dict()["model"]["norm_first"] is True
    model = Transformer(vocab_size=40, **config.architecture)
    model.build()
    for stack in (model.encoder, model.decoder):
        assert stack.final_norm is not None
        assert all(layer.norm_first for layer in stack.stack)
    post = Transformer(vocab_size=40, **make_config(preset="tiny").resolved().architecture)
    assert post.encoder.final_norm is None and not post.encoder.stack[0].norm_first


# -- the moving average of the weights ---------------------------------------------------------
def _regression(optimizer):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer=optimizer, loss="mse", run_eagerly=True)  # no tracing: faster
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(16, 4)), rng.normal(size=(16, 3)), batch_size=4, epochs=2,
              shuffle=False, verbose=0)
    return model


@pytest.mark.parametrize("fused", [True, False])
def test_the_moving_average_is_optimizer_state_and_the_trained_weights_stay(fused):
    model = _regression(paper_optimizer(4, warmup_steps=2, fused=fused, ema_momentum=0.5))
    optimizer = model.optimizer
    assert isinstance(optimizer, FusedAdam if fused else AveragingAdam)
    averages = optimizer._model_variables_moving_average
    # One average per weight, among the optimizer's variables (so in every checkpoint).
    assert len(averages) == len(model.trainable_variables)
    assert {id(v) for v in averages} <= {id(v) for v in optimizer.variables}
    trained = [v.numpy() for v in model.trainable_variables]
    average = [v.numpy() for v in averages]
    assert not np.allclose(trained[0], average[0])  # the end of fit left the trained weights
    with averaged_weights(model):
        for variable, expected in zip(model.trainable_variables, average):
            np.testing.assert_array_equal(variable.numpy(), expected)
    for variable, expected in zip(model.trainable_variables, trained):
        np.testing.assert_array_equal(variable.numpy(), expected)
    # Without an average the block changes nothing.
    plain = _regression(paper_optimizer(4, warmup_steps=2, fused=fused))
    before = [v.numpy() for v in plain.trainable_variables]
    with averaged_weights(plain):
        for variable, expected in zip(plain.trainable_variables, before):
            np.testing.assert_array_equal(variable.numpy(), expected)


# -- in training runs --------------------------------------------------------------------------
def _trained_weights(run_dir, step, config):
    """(model, trained weights, their moving average) of a run's newest checkpoint, which is
    of `step`."""
    from keras_transformer.training import compile_model

    run = Run(run_dir)
    model = run.build_model()
    compile_model(model, config)
    assert run.restore(model)[1] == step
    trained = [v.numpy() for v in model.trainable_variables]
    with averaged_weights(model):
        average = [v.numpy() for v in model.trainable_variables]
    return model, trained, average


@pytest.mark.slow
def test_a_decaying_schedule_trains_to_zero_and_the_run_keeps_its_horizon(
        toy_corpus, runtime_preset, tmp_path):
    from tests.conftest import toy_config
    from keras_transformer.training import train

    run_dir = tmp_path / "run"
    settings = dict(lr_schedule="cosine", warmup_steps=4, train_steps=10, peak_lr=3e-3,
                    clip_norm=1.0)
    assert train(toy_config(toy_corpus, run_dir, **settings))["step"] == 10
    saved = json.loads((run_dir / "config.json").read_text())["optimization"]
    assert (saved["lr_schedule"], saved["train_steps"], saved["clip_norm"]) == ("cosine", 10,
                                                                               1.0)
    run = Run(run_dir)
    model, _, _ = _trained_weights(run_dir, 10, run.config)
    assert isinstance(model.optimizer._learning_rate, WarmupCosineDecay)
    assert int(model.optimizer.iterations) == 10
    assert float(model.optimizer.learning_rate) == 0.0  # the schedule's end
    with pytest.raises(ConfigError, match="decays to 0 at train_steps=10"):
        train(toy_config(toy_corpus, run_dir, **dict(settings, train_steps=12)))


@pytest.mark.slow
def test_a_run_with_a_moving_average_saves_it_and_resumes_exactly(toy_corpus, runtime_preset,
                                                                  tmp_path):
    """The run stopped at step 10 saved its last checkpoint after `fit` ended (checkpoints
    every 7 steps): that checkpoint holds the trained weights, so the resumed run equals the
    run trained straight to step 14, and both save the average as model.keras."""
    from tests.conftest import toy_config
    from keras_transformer.training import train

    settings = dict(ema_momentum=0.8, checkpoint_steps=7, warmup_steps=5)
    straight, pieces = tmp_path / "straight", tmp_path / "pieces"
    train(toy_config(toy_corpus, straight, train_steps=14, **settings))
    train(toy_config(toy_corpus, pieces, train_steps=10, **settings))
    train(toy_config(toy_corpus, pieces, train_steps=14, **settings))
    config = Run(straight).config
    _, trained, average = _trained_weights(straight, 14, config)
    _, trained_pieces, average_pieces = _trained_weights(pieces, 14, config)
    for a, b in zip(trained + average, trained_pieces + average_pieces):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for run_dir in (straight, pieces):
        saved = keras.models.load_model(run_dir / "model.keras", compile=False)
        for variable, expected in zip(saved.trainable_variables, average):
            np.testing.assert_allclose(variable.numpy(), expected, rtol=1e-5, atol=1e-6)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(trained, average)) > 1e-4


# -- the sweep of the quick recipe (benchmarks/recipe_sweep.py) ----------------------------------
@pytest.fixture
def recipe_sweep(monkeypatch):
    import importlib
    import pathlib

    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
    return importlib.import_module("recipe_sweep")


def test_every_sweep_point_is_a_valid_run_and_quick_is_the_demos_recipe(recipe_sweep,
                                                                         tmp_path):
    from keras_transformer.tasks.main_job import QUICK

    for name in recipe_sweep.SETTINGS:
        for seed in (1234, 1236):
            config, plan = recipe_sweep.run_config(name, 1200, seed, tmp_path)
            config = config.resolved()  # refuses what cannot run (warmup past the decay, ...)
            assert (config.seed, config.train_steps) == (seed, plan["train_steps"])
            assert config.output_dir.endswith(f"{name}-1200" + ("-seed1236" if seed == 1236
                                                                  else ""))
    quick, _ = recipe_sweep.run_config("quick", 1200, 1234, tmp_path)
    demo = make_config(output_dir=str(tmp_path), **QUICK)
    for key in ("preset", "num_layers", "dropout", "vocab_size", "tokens_per_batch",
                "max_length", "warmup_steps", "train_steps", "checkpoint_steps",
                "label_smoothing", "lr_schedule", "lr_scale", "norm_first", "seed"):
        assert getattr(quick.resolved(), key) == getattr(demo.resolved(), key), key
    # A decaying schedule at the peak today's recipe reaches (800 of 1200 steps of warmup).
    cosine, plan = recipe_sweep.run_config("quick-cosine", 1200, 1234, tmp_path)
    assert (cosine.lr_schedule, cosine.warmup_steps) == ("cosine", 100)
    assert cosine.peak_lr == pytest.approx(paper_peak(256, 800))
    doubled, plan = recipe_sweep.run_config("quick-tokens2048-steps2x", 1200, 1234, tmp_path)
    assert (doubled.tokens_per_batch, doubled.train_steps, doubled.warmup_steps) \
        == (2048, 2400, 1600)


def test_the_sweep_reads_its_results_by_setting_budget_and_seed(recipe_sweep, tmp_path):
    names, unknown = recipe_sweep.chosen("quick-cosine,quick*,nothing*")
    assert names[:2] == ["quick-cosine", "quick"] and len(names) == len(set(names)) > 15
    assert all(n.startswith("quick") for n in names) and unknown == ["nothing*"]
    results = tmp_path / "results.jsonl"
    lines = [dict(setting="quick", steps=1200, val500_greedy_sacrebleu=36.0),  # no seed: 1234
             dict(setting="quick", steps=1200, seed=1235, val500_greedy_sacrebleu=35.0)]
    results.write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = recipe_sweep.read_results(results)
    assert set(done) == {("quick", 1200, 1234), ("quick", 1200, 1235)}
    spread = recipe_sweep.seed_spread(done.values())["quick"]
    assert spread["seeds"] == [1234, 1235]
    assert spread["val500_greedy_sacrebleu"] == {"mean": 35.5, "spread": 1.0}
    results.write_text("not json\n")
    with pytest.raises(SystemExit, match="results.jsonl:1: not a result line"):
        recipe_sweep.read_results(results)
