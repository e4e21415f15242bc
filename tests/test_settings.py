"""Settings are declared once: flags, config files, the effective config and config.json all
come from the declarations in keras_transformer.runs.config."""

import argparse
import dataclasses
import inspect
import json
import pathlib

import pytest

from keras_transformer.errors import ConfigError
from keras_transformer.runs import Run
from keras_transformer.runs.config import TrainConfig, load_config_file, make_config
from keras_transformer.runs.sections import DataSettings
from keras_transformer.runs.settings import setting

ROOT = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass
class DataWithNoise(DataSettings):
    noise_rate: float = setting(0.05, "chance of swapping two source words (a test's setting)")


@dataclasses.dataclass
class NoisyConfig(TrainConfig):
    data: DataWithNoise = dataclasses.field(default_factory=DataWithNoise)


def _help(config_class, command="train"):
    from keras_transformer.cli import train as train_command

    parser = argparse.ArgumentParser(prog="keras-transformer")
    train_command.register(parser.add_subparsers(dest="command"), config_class=config_class)
    return parser._subparsers._group_actions[0].choices[command].format_help()


def test_a_new_field_reaches_the_flags_the_effective_config_and_config_json(tmp_path):
    text = _help(NoisyConfig)
    assert "--noise-rate" in text and "chance of swapping two source words" in text
    assert "--noise-rate" not in _help(TrainConfig)

    config = make_config(None, config_class=NoisyConfig, origin="flag", noise_rate=0.1,
                         output_dir=str(tmp_path / "run"), preset="tiny").resolved()
    assert config.noise_rate == 0.1 and config.data.noise_rate == 0.1
    assert "noise_rate 0.1 [flag]" in config.describe()

    Run(tmp_path / "run").save_config(config)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["data"]["noise_rate"] == 0.1
    assert NoisyConfig.from_document(saved, "config.json").noise_rate == 0.1


def test_the_old_declaration_tables_are_gone():
    for path in (ROOT / "keras_transformer").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for name in ("CONFIG_HELP", "PREPARE_KEYS", "ARCHITECTURE_KEYS"):
            assert name not in text, f"{name} in {path}"


def test_the_effective_config_is_short_and_has_no_nulls():
    from keras_transformer.tasks.main_job import QUICK

    config = make_config(None, origin="flag", output_dir="runs/x", **QUICK).resolved()
    text = config.describe()
    assert len(text.splitlines()) <= 30
    assert "None" not in text and "null" not in text
    assert "num_layers 2 [flag]" in text and "d_model 256 [preset]" in text
    # Every architecture key once, inside the model section: no second form.
    document = config.to_dict()
    assert set(document) == {"format_version", "model", "data", "optimization", "run",
                             "parent", "distill"}
    assert document["model"]["d_model"] == 256 and "d_model" not in document["data"]


def test_the_model_section_is_the_transformers_own_arguments():
    from keras_transformer.models import Transformer

    arguments = set(inspect.signature(Transformer.__init__).parameters)
    config = make_config(preset="base-e-learned").resolved()
    assert set(config.architecture) <= arguments
    model = Transformer(vocab_size=100, **config.architecture)
    assert model.architecture["max_length"] == 512  # max_positions in the config


def test_config_files_take_sections_or_flat_keys(tmp_path):
    nested = tmp_path / "nested.yaml"
    nested.write_text("model:\n  preset: tiny\n  d_model: 64\ndata:\n  vocab_size: 500\n"
                      "train_steps: 30\n")
    values = load_config_file(nested)
    assert values == {"preset": "tiny", "d_model": 64, "vocab_size": 500, "train_steps": 30}
    config = make_config(nested, train_steps=40)
    assert (config.d_model, config.vocab_size, config.train_steps) == (64, 500, 40)
    assert config.sources["d_model"] == "file" and config.sources["train_steps"] == "given"

    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("data:\n  d_model: 64\n")
    with pytest.raises(ConfigError, match="unknown key 'd_model' in section 'data'"):
        load_config_file(wrong)


def test_one_check_per_value_names_the_key():
    with pytest.raises(ConfigError, match="'num_heads' must be positive"):
        make_config(num_heads=0)
    with pytest.raises(ConfigError, match="'positional' must be one of sinusoidal, learned"):
        make_config(positional="rotary")
    with pytest.raises(ConfigError, match="d_model=510 is not divisible by num_heads=8"):
        make_config(preset="base", d_model=510).resolved()


def test_a_resumed_run_compares_only_what_was_given(tmp_path):
    saved = make_config(preset="tiny", output_dir=str(tmp_path / "a"), dropout=0.0,
                        train_steps=100).resolved()
    # Only the directory and a resumable key given: the run's settings, the new step count.
    extended = saved.continued(make_config(origin="flag", output_dir=str(tmp_path / "b"),
                                           train_steps=110))
    assert extended.train_steps == 110 and extended.output_dir == str(tmp_path / "b")
    assert (extended.preset, extended.dropout) == ("tiny", 0.0)
    assert extended.sources == {"output_dir": "flag", "train_steps": "flag"}
    # Given and equal to the run's own: nothing changed, nothing marked.
    assert saved.continued(make_config(origin="flag", output_dir=saved.output_dir)).sources == {}
    # Given and equal to the run's: fine. Given and different: named.
    saved.continued(make_config(preset="tiny", dropout=0.0))
    with pytest.raises(ConfigError, match=r"dropout: 0.0 -> 0.1"):
        saved.continued(make_config(preset="tiny", dropout=0.1))


def test_pad_to_bucket_is_on_by_default_where_the_step_is_compiled_per_shape():
    """auto: static shapes under JAX and TensorFlow with --xla, the exact shapes on TensorFlow
    without XLA (this process's backend); the effective config says why; a given value stays."""
    from keras_transformer.runs.config import static_shapes

    assert static_shapes(False, "jax") == (True, "jax compiles the step once per batch shape")
    assert static_shapes(True, "tensorflow")[0] is True
    assert static_shapes(False, "tensorflow") == (
        False, "TensorFlow without XLA runs any batch shape")
    config = make_config(preset="tiny").resolved()
    assert config.pad_to_bucket is False
    assert ("pad_to_bucket False [auto: TensorFlow without XLA runs any batch shape]"
            in " ".join(config.describe().split()))
    assert make_config(preset="tiny", xla=True).resolved().pad_to_bucket is True
    given = make_config(preset="tiny", origin="flag", pad_to_bucket=True).resolved()
    assert given.pad_to_bucket is True and given.sources["pad_to_bucket"] == "flag"
    assert given.resolved().to_dict()["data"]["pad_to_bucket"] is True


def test_a_format_2_document_reads_as_the_same_config():
    """config.json as keras-transformer 0.2.0 wrote it: flat keys, mostly null architecture
    keys, the architecture beside them."""
    config = make_config(preset="multi30k", num_layers=2, dropout=0.0, train_steps=1200,
                         warmup_steps=800, output_dir="runs/x").resolved()
    old = {"format_version": 2, **{key: None for key in config.architecture}}
    old.pop("max_length")
    old.update({key: value for key, value in config.values().items()
                if key not in config.architecture and key != "max_positions"})
    old["num_layers"] = 2
    old["architecture"] = {**config.architecture}
    read = TrainConfig.from_document(old, "config.json")
    assert read.values() == config.values()
