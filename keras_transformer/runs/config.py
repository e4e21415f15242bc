"""A training run's config: the sections of settings (each setting declared once, in
runs/sections.py) put together as `TrainConfig`, loaded from a file and merged with overrides.

    config = make_config("recipe.yaml", train_steps=2000)   # a file, then flat overrides
    config.optimization.train_steps, config.train_steps      # the same value
    config.resolved().model.d_model                          # filled in from the preset

A config file (YAML or JSON) holds sections (`model:`, `data:`, `optimization:`, `run:`) or
flat keys, or both; `keras-transformer train` has one flag per setting. The model section is
the preset plus the `Transformer`'s own architecture arguments: `resolved()` fills what the
command left unset from the preset, so a run saves its whole architecture and never looks its
preset up again. `continued()` is how a run resumes: its saved settings, with only what the
command gave explicitly compared against them.
"""

import dataclasses
import json
import pathlib
import typing


from keras_transformer.errors import ConfigError
from keras_transformer.models.presets import get_preset
from keras_transformer.runs.sections import (AUTO, DECAYING, WSD, WSD_COOLDOWN, DataSettings,
                                             DistillationSettings, ModelSettings,
                                             OptimizationSettings, ParentSettings, RunSettings)
from keras_transformer.runs.settings import FILE, FLAG, GIVEN, PRESET, Settings


@dataclasses.dataclass
class TrainConfig(Settings):
    """Everything a training run needs, by section."""

    FORMAT_VERSION: typing.ClassVar[int] = 3  # 2: flat keys + "architecture"; 1: no architecture

    model: ModelSettings = dataclasses.field(default_factory=ModelSettings)
    data: DataSettings = dataclasses.field(default_factory=DataSettings)
    optimization: OptimizationSettings = dataclasses.field(default_factory=OptimizationSettings)
    run: RunSettings = dataclasses.field(default_factory=RunSettings)
    parent: ParentSettings = dataclasses.field(default_factory=ParentSettings)
    distill: DistillationSettings = dataclasses.field(default_factory=DistillationSettings)

    @property
    def architecture(self):
        """The `Transformer` arguments of a resolved config (all but the vocabulary size)."""
        return self.model.architecture()

    def resolved(self):
        """A copy with what the preset decides filled in: the architecture and the training
        defaults (train_steps, warmup_steps, label_smoothing)."""
        sources = dict(self.sources)
        model = self.model.resolved(sources)
        optimization = dataclasses.asdict(self.optimization)
        training = get_preset(self.model.preset)["training"]
        for key in ("train_steps", "warmup_steps", "label_smoothing"):
            if optimization[key] is None:
                optimization[key] = training[key]
                sources.setdefault(key, PRESET)
        if optimization["lr_schedule"] == WSD and optimization["cooldown_fraction"] is None:
            optimization["cooldown_fraction"] = WSD_COOLDOWN
            sources.setdefault("cooldown_fraction", "wsd's default")
        if optimization["precision"] == AUTO:
            optimization["precision"], reason = _machine_precision()
            sources["precision"] = f"auto: {reason}"
        data = self.data
        if data.pad_to_bucket is None:
            pad, reason = static_shapes(self.optimization.xla)
            data = dataclasses.replace(data, pad_to_bucket=pad)
            sources["pad_to_bucket"] = f"auto: {reason}"
        config = dataclasses.replace(self, model=model, data=data,
                                     optimization=OptimizationSettings(**optimization))
        config.sources.update(sources)
        return config

    @property
    def target_languages(self):
        """The targets of a run of several pairs (None for one pair)."""
        return self.data.target_languages

    def pair(self, tgt_lang=None):
        """The `runs.pairs.Pair` into `tgt_lang` (default: the first); ConfigError naming the
        run's targets for another language."""
        pairs = self.data.pairs()
        if tgt_lang is None:
            return pairs[0]
        for pair in pairs:
            if pair.tgt_lang == tgt_lang:
                return pair
        raise ConfigError(f"this run translates into {', '.join(p.tgt_lang for p in pairs)}, "
                          f"not {tgt_lang!r}.")

    def data_arguments(self, tgt_lang=None):
        """What `pipelines.datasets.load_pairs` needs after the dataset and split (of the pair
        into `tgt_lang` for a run of several: default the first)."""
        data = self.data
        if self.target_languages is None:
            return dict(src_lang=data.src_lang, tgt_lang=data.tgt_lang, data_dir=data.data_dir,
                        source_dir=data.source_dir,
                        text_files={"train": (data.train_src, data.train_tgt),
                                    "dev": (data.dev_src, data.dev_tgt)})
        pair = self.pair(tgt_lang)
        return dict(src_lang=pair.src_lang, tgt_lang=pair.tgt_lang, data_dir=data.data_dir,
                    source_dir=data.source_dir, text_files=pair.text_files())

    def prepared_data_arguments(self):
        """What `pipelines.datasets.prepare_training_data` needs after the dataset (several
        pairs: lists of languages and of each pair's files, and the mixing temperature)."""
        data = self.data
        arguments = dict(cache_dir=data.data_cache, vocab_size=data.vocab_size, seed=self.seed,
                         max_length=data.max_length, shard_pairs=data.shard_pairs,
                         data_dir=data.data_dir, source_dir=data.source_dir)
        if self.target_languages is None:
            return dict(arguments, src_lang=data.src_lang, tgt_lang=data.tgt_lang,
                        text_files=self.data_arguments()["text_files"])
        pairs = data.pairs()
        return dict(arguments, src_lang=[p.src_lang for p in pairs],
                    tgt_lang=[p.tgt_lang for p in pairs],
                    text_files=[p.text_files() for p in pairs],
                    pair_sampling_temperature=data.pair_sampling_temperature)

    def continued(self, requested):
        """This saved (resolved) config, continued by a command that resumes the run: the
        values `requested` was given explicitly (flags, a file, arguments) may change the
        resumable settings and the run's location; any other explicit value that differs
        raises ConfigError naming every such key. Everything else keeps the run's value."""
        keys = type(self).keys()
        saved, changes, changed = self.values(), {}, {}
        for key in requested.sources:
            if (key not in keys or requested.sources[key] == PRESET
                    or getattr(requested, key) == AUTO):  # auto: whatever the run has
                continue
            value, meta = getattr(requested, key), keys[key][1].metadata
            if meta["resumable"] or meta["location"]:
                if value != saved[key]:
                    changes[key] = value
            elif value != saved[key]:
                changed[key] = (saved[key], value)
        _check_decay_horizon(saved, changes)
        if changed:
            details = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
            resumable = sorted(k for k, v in keys.items() if v[1].metadata["resumable"])
            raise ConfigError(
                f"this run was trained with a different config ({details}); only "
                f"{', '.join(resumable)} may change when it resumes. Train into another output "
                "directory, or delete this one to start over.")
        # Unmarked values are the run's own; the changes say where they came from.
        return type(self).from_values({**saved, **changes},
                                      {key: requested.sources[key] for key in changes})

    @classmethod
    def from_document(cls, document, where):
        """A config from a saved config.json document (this format or an older one)."""
        document = dict(document)
        version = document.pop("format_version", 1)
        if not isinstance(version, int) or version > cls.FORMAT_VERSION:
            raise ConfigError(f"{where} has format version {version!r}, newer than this "
                              f"keras-transformer reads ({cls.FORMAT_VERSION}): upgrade it.")
        if version < 3:  # flat keys, the architecture in one mapping beside them
            architecture = document.pop("architecture", None) or {}
            for key in ("num_layers", "d_model", "num_heads", "d_ff", "key_dim", "value_dim",
                        "dropout", "norm_first", "positional"):
                if key in architecture:
                    document[key] = architecture[key]
            if architecture.get("max_length") is not None:
                document["max_positions"] = architecture["max_length"]
        return cls.from_values(cls.flatten(document, where))


def _check_decay_horizon(saved, changes):
    """A run whose learning rate decays to 0 at train_steps keeps them when it resumes: other
    steps would move the end of the decay after part of it was trained (the rate jumping
    back up, or falling off a cliff). ConfigError saying what to do instead."""
    if saved["lr_schedule"] in DECAYING and "train_steps" in changes:
        raise ConfigError(
            f"this run's learning rate (lr_schedule {saved['lr_schedule']!r}) decays to 0 at "
            f"train_steps={saved['train_steps']}; resuming it with train_steps="
            f"{changes['train_steps']} would change its schedule mid-run. Resume it with its "
            "own train_steps, or train a new run from its weights with a schedule of its own "
            "(--init-from, docs/fine-tuning.md).")


def _machine_precision():
    """(policy, reason) of `precision: auto` on this machine and backend."""
    import keras

    from keras_transformer import hardware

    backend = keras.backend.backend()
    accelerator = hardware.jax_accelerator() if backend == "jax" else None
    return hardware.choose_precision(backend=backend, accelerator=accelerator)


def static_shapes(xla, backend=None):
    """(pad_to_bucket, reason) of `pad_to_bucket: auto`: on where the training step is compiled
    once per batch shape (every step under JAX; TensorFlow's with --xla), where a few static
    shapes save compilations (on Multi30k 6 steps compiled instead of 22, each some seconds on a
    GPU); off on TensorFlow without XLA, which runs any shape as it comes."""
    if backend is None:
        import keras

        backend = keras.backend.backend()
    if backend == "tensorflow":
        if xla:
            return True, "XLA (--xla) compiles the step once per batch shape"
        return False, "TensorFlow without XLA runs any batch shape"
    return True, f"{backend} compiles the step once per batch shape"


def load_config_file(path):
    """Reads a YAML or JSON config file into {setting: value} (sections or flat keys),
    refusing unknown keys by name."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError(f"Config file not found: {path}")
    text = path.read_text(encoding="utf-8")
    import yaml

    try:
        values = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        raise ConfigError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                          f"{error}") from None
    values = values or {}
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got "
                          f"{type(values).__name__}")
    return TrainConfig.flatten(values, str(path))


def make_config(file=None, *, config_class=TrainConfig, origin=GIVEN, **overrides):
    """A config from an optional file, then flat keyword overrides (None values are ignored).
    The sources say which came from the file and which from the overrides (`origin`: "flag"
    for the command line)."""
    values = load_config_file(file) if file else {}
    sources = {key: FILE for key in values}
    overrides = {k: v for k, v in overrides.items() if v is not None}
    values.update(overrides)
    sources.update({key: origin for key in overrides})
    return config_class.from_values(values, sources)


__all__ = ["FILE", "FLAG", "TrainConfig", "load_config_file", "make_config", "static_shapes"]
