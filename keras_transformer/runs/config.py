"""Training configuration: one flat set of keys shared by the command line and config files.

A config file (YAML or JSON) holds any of the keys below; command-line flags override it.
Unknown keys and invalid values raise `ConfigError` naming them.

The architecture is a preset plus optional architecture keys (num_layers, d_model, num_heads,
d_ff, key_dim, value_dim, dropout, norm_first, positional). `resolved()` turns them into the
complete `architecture` (every `Transformer` argument), which a run saves: a run never looks its
preset up again, so changing or removing a preset later does not change a run.
"""

import dataclasses
import json
import pathlib
import typing

import yaml

from keras_transformer.defaults import MAX_LENGTH
from keras_transformer.errors import ConfigError
from keras_transformer.models.presets import ARCHITECTURE_KEYS, get_preset, resolve_architecture
from pipelines.datasets import DATASETS

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
STRATEGIES = ("default", "mirrored", "multiworker")

# Keys that may change when a run is resumed; any other change means a different run.
RESUMABLE_KEYS = frozenset({
    "train_steps", "time_limit_minutes", "verbose", "eval_steps", "bleu_steps", "bleu_sentences",
    "checkpoint_minutes", "checkpoint_steps", "keep_checkpoints",
})
# Where the run is, not what it is: a moved or renamed run directory is the same run.
LOCATION_KEYS = frozenset({"output_dir", "data_cache", "prepared_data"})


@dataclasses.dataclass
class TrainConfig:
    """Everything a training run needs. `None` means: take the preset's value."""

    # Model: a preset, and architecture keys on top of it
    preset: str = "small"
    num_layers: typing.Optional[int] = None
    d_model: typing.Optional[int] = None
    num_heads: typing.Optional[int] = None
    d_ff: typing.Optional[int] = None
    key_dim: typing.Optional[int] = None
    value_dim: typing.Optional[int] = None
    dropout: typing.Optional[float] = None
    norm_first: typing.Optional[bool] = None
    positional: typing.Optional[str] = None
    # Data
    dataset: str = "multi30k"
    src_lang: str = "en"
    tgt_lang: str = "de"
    train_src: typing.Optional[str] = None  # dataset "text": parallel files
    train_tgt: typing.Optional[str] = None
    dev_src: typing.Optional[str] = None
    dev_tgt: typing.Optional[str] = None
    data_dir: typing.Optional[str] = None  # tfds data_dir
    source_dir: typing.Optional[str] = None  # Multi30k raw files / PTB sample (shared data)
    vocab_size: int = 8000
    data_cache: typing.Optional[str] = None  # prepared data (default: pipelines.prepared)
    prepared_data: typing.Optional[str] = None  # one prepared folder to train from, as it is
    shard_pairs: int = 100_000  # source pairs per prepared shard
    tokens_per_batch: int = 4096  # per side, per replica (paper: ~25000)
    max_length: int = MAX_LENGTH
    pad_to_bucket: bool = False
    # Optimization
    train_steps: typing.Optional[int] = None
    warmup_steps: typing.Optional[int] = None
    label_smoothing: typing.Optional[float] = None
    lr_scale: float = 1.0
    grad_accum_steps: int = 1
    precision: str = "float32"
    xla: bool = False
    seed: int = 1234
    strategy: str = "default"
    num_replicas: int = 2  # mirrored on a CPU-only host: logical CPU devices
    # Checkpoints, evaluation, output
    output_dir: str = "runs/multi30k-en-de"
    checkpoint_minutes: float = 10.0
    checkpoint_steps: typing.Optional[int] = None
    keep_checkpoints: int = 5
    eval_steps: int = 500
    bleu_steps: typing.Optional[int] = None
    bleu_sentences: int = 200
    time_limit_minutes: typing.Optional[float] = None
    verbose: int = 1
    # Filled by resolved(): every Transformer argument but the vocabulary size.
    architecture: typing.Optional[dict] = None

    def __post_init__(self):
        self.validate()

    def validate(self):
        """Checks types and ranges; raises ConfigError naming the key and the value."""
        hints = typing.get_type_hints(type(self))
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            expected = hints[field.name]
            optional = typing.get_origin(expected) is typing.Union
            base = typing.get_args(expected)[0] if optional else expected
            if value is None and optional:
                continue
            if base is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
                setattr(self, field.name, value)
            if not isinstance(value, base) or (base is int and isinstance(value, bool)):
                raise ConfigError(
                    f"Config key {field.name!r} must be {base.__name__}"
                    f"{' or null' if optional else ''}; got {value!r}."
                )

        def check(ok, key, rule):
            if not ok:
                raise ConfigError(f"Config key {key!r} {rule}; got {getattr(self, key)!r}.")

        if self.architecture is None:
            get_preset(self.preset)  # unknown preset -> ConfigError listing the presets
        check(self.dataset in DATASETS, "dataset", f"must be one of {DATASETS}")
        check(self.precision in POLICIES, "precision", f"must be one of {POLICIES}")
        check(self.strategy in STRATEGIES, "strategy", f"must be one of {STRATEGIES}")
        check(self.src_lang != self.tgt_lang, "tgt_lang", "must differ from src_lang")
        for key in ("vocab_size", "shard_pairs", "tokens_per_batch", "max_length",
                    "grad_accum_steps", "keep_checkpoints", "eval_steps", "bleu_sentences",
                    "num_replicas"):
            check(getattr(self, key) > 0, key, "must be positive")
        for key in ("train_steps", "warmup_steps", "checkpoint_steps", "bleu_steps",
                    "num_layers", "d_model", "num_heads", "d_ff", "key_dim", "value_dim"):
            value = getattr(self, key)
            check(value is None or value > 0, key, "must be positive")
        for key in ("dropout", "label_smoothing"):
            value = getattr(self, key)
            check(value is None or 0.0 <= value < 1.0, key, "must be in [0, 1)")
        check(self.positional in (None, "sinusoidal", "learned"), "positional",
              "must be 'sinusoidal' or 'learned'")
        check(self.lr_scale > 0, "lr_scale", "must be positive")
        check(self.checkpoint_minutes > 0, "checkpoint_minutes", "must be positive")
        check(self.time_limit_minutes is None or self.time_limit_minutes > 0,
              "time_limit_minutes", "must be positive")
        check(self.tokens_per_batch >= self.max_length, "tokens_per_batch",
              f"must be at least max_length={self.max_length}")
        if self.dataset == "text":
            for key in ("train_src", "train_tgt"):
                check(getattr(self, key) is not None, key, "is required with dataset 'text'")

    def architecture_overrides(self):
        return {key: getattr(self, key) for key in ARCHITECTURE_KEYS
                if getattr(self, key) is not None}

    def resolved(self):
        """A copy with the preset's values filled in: `architecture` (unless already there)
        and the training defaults (train_steps, warmup_steps, label_smoothing)."""
        values = dataclasses.asdict(self)
        if values["architecture"] is None:
            values["architecture"] = resolve_architecture(self.preset,
                                                          **self.architecture_overrides())
        if any(values[key] is None for key in ("train_steps", "warmup_steps", "label_smoothing")):
            training = get_preset(self.preset)["training"]
            for key in ("train_steps", "warmup_steps", "label_smoothing"):
                if values[key] is None:
                    values[key] = training[key]
        return TrainConfig(**values)

    def to_dict(self):
        return dataclasses.asdict(self)

    def data_arguments(self):
        """What `pipelines.datasets.load_pairs` needs after the dataset and split."""
        return dict(src_lang=self.src_lang, tgt_lang=self.tgt_lang, data_dir=self.data_dir,
                    source_dir=self.source_dir,
                    text_files={"train": (self.train_src, self.train_tgt),
                                "dev": (self.dev_src, self.dev_tgt)})

    def prepared_data_arguments(self):
        """What `pipelines.datasets.prepare_training_data` needs after the dataset."""
        return dict(src_lang=self.src_lang, tgt_lang=self.tgt_lang, cache_dir=self.data_cache,
                    vocab_size=self.vocab_size, seed=self.seed, max_length=self.max_length,
                    shard_pairs=self.shard_pairs, data_dir=self.data_dir,
                    source_dir=self.source_dir, text_files=self.data_arguments()["text_files"])

    def continued(self, requested):
        """This (saved, resolved) config continued with `requested`, the config of a command
        that resumes the run: the saved architecture and settings win, `requested` may change
        the resumable keys and the run's location. A key `requested` leaves at None keeps its
        saved value; any other difference raises ConfigError naming every such key."""
        saved, asked = self.to_dict(), requested.to_dict()
        changed = {}
        for key, value in asked.items():
            if key in RESUMABLE_KEYS or key in LOCATION_KEYS:
                if value is not None:
                    saved[key] = value
                continue
            if value is None or key == "architecture":
                continue
            old = saved["architecture"][key] if key in ARCHITECTURE_KEYS else saved[key]
            if value != old:
                changed[key] = (old, value)
        if changed:
            details = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
            raise ConfigError(
                f"this run was trained with a different config ({details}); only "
                f"{', '.join(sorted(RESUMABLE_KEYS))} may change when it resumes. Train into "
                "another output directory, or delete this one to start over.")
        return TrainConfig(**saved)


def field_names():
    return [field.name for field in dataclasses.fields(TrainConfig)]


def load_config_file(path):
    """Reads a YAML or JSON config file into a dict, rejecting unknown keys by name."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ConfigError(f"Config file not found: {path}")
    text = path.read_text(encoding="utf-8")
    try:
        values = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        raise ConfigError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                          f"{error}") from None
    values = values or {}
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of config keys, got "
                          f"{type(values).__name__}")
    unknown = sorted(set(values) - set(field_names()))
    if unknown:
        raise ConfigError(f"{path}: unknown config key(s) {', '.join(map(repr, unknown))}. "
                          f"Known keys: {', '.join(field_names())}.")
    return values


def make_config(file=None, **overrides):
    """Config from an optional file, then keyword overrides (None values are ignored)."""
    values = load_config_file(file) if file else {}
    unknown = sorted(set(overrides) - set(field_names()))
    if unknown:
        raise ConfigError(f"Unknown config key(s): {', '.join(map(repr, unknown))}.")
    values.update({k: v for k, v in overrides.items() if v is not None})
    return TrainConfig(**values)
