"""Training configuration: one flat set of keys shared by the command line and config files.

A config file (YAML or JSON) holds any of the keys below; command-line flags override it.
Unknown keys and invalid values raise `ValueError` naming them.
"""

import dataclasses
import json
import pathlib
import typing

import yaml

from keras_transformer.presets import get_preset

DATASETS = ("multi30k", "wmt14", "text", "ptb")
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
STRATEGIES = ("default", "mirrored", "multiworker")


@dataclasses.dataclass
class TrainConfig:
    """Everything a training run needs. `None` means: take the preset's value."""

    # Model
    preset: str = "small"
    dropout: typing.Optional[float] = None
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
    tokens_per_batch: int = 4096  # per side, per replica (paper: ~25000)
    max_length: int = 256
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

    def __post_init__(self):
        self.validate()

    def validate(self):
        """Checks types and ranges; raises ValueError naming the key and the value."""
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
                raise ValueError(
                    f"Config key {field.name!r} must be {base.__name__}"
                    f"{' or null' if optional else ''}; got {value!r}."
                )

        def check(ok, key, rule):
            if not ok:
                raise ValueError(f"Config key {key!r} {rule}; got {getattr(self, key)!r}.")

        get_preset(self.preset)  # unknown preset -> ValueError listing the presets
        check(self.dataset in DATASETS, "dataset", f"must be one of {DATASETS}")
        check(self.precision in POLICIES, "precision", f"must be one of {POLICIES}")
        check(self.strategy in STRATEGIES, "strategy", f"must be one of {STRATEGIES}")
        check(self.src_lang != self.tgt_lang, "tgt_lang", "must differ from src_lang")
        for key in ("vocab_size", "tokens_per_batch", "max_length", "grad_accum_steps",
                    "keep_checkpoints", "eval_steps", "bleu_sentences", "num_replicas"):
            check(getattr(self, key) > 0, key, "must be positive")
        for key in ("train_steps", "warmup_steps", "checkpoint_steps", "bleu_steps"):
            value = getattr(self, key)
            check(value is None or value > 0, key, "must be positive")
        for key in ("dropout", "label_smoothing"):
            value = getattr(self, key)
            check(value is None or 0.0 <= value < 1.0, key, "must be in [0, 1)")
        check(self.lr_scale > 0, "lr_scale", "must be positive")
        check(self.checkpoint_minutes > 0, "checkpoint_minutes", "must be positive")
        check(self.time_limit_minutes is None or self.time_limit_minutes > 0,
              "time_limit_minutes", "must be positive")
        check(self.tokens_per_batch >= self.max_length, "tokens_per_batch",
              f"must be at least max_length={self.max_length}")
        if self.dataset == "text":
            for key in ("train_src", "train_tgt"):
                check(getattr(self, key) is not None, key, "is required with dataset 'text'")

    def resolved(self):
        """A copy with preset-dependent defaults filled in."""
        training = get_preset(self.preset)["training"]
        values = dataclasses.asdict(self)
        for key in ("train_steps", "warmup_steps", "label_smoothing"):
            if values[key] is None:
                values[key] = training[key]
        return TrainConfig(**values)

    def to_dict(self):
        return dataclasses.asdict(self)

    def save(self, path):
        path = pathlib.Path(path)
        temporary = path.with_suffix(path.suffix + ".tmp")
        temporary.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        temporary.replace(path)


def load_run_config(run_dir):
    """The config a training run saved in RUN_DIR/config.json."""
    path = pathlib.Path(run_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{run_dir} is not a training run directory (no config.json).")
    return TrainConfig(**json.loads(path.read_text()))


def field_names():
    return [field.name for field in dataclasses.fields(TrainConfig)]


def load_config_file(path):
    """Reads a YAML or JSON config file into a dict, rejecting unknown keys by name."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ValueError(f"Config file not found: {path}")
    text = path.read_text(encoding="utf-8")
    try:
        values = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        raise ValueError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                         f"{error}") from None
    values = values or {}
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of config keys, got {type(values).__name__}")
    unknown = sorted(set(values) - set(field_names()))
    if unknown:
        raise ValueError(f"{path}: unknown config key(s) {', '.join(map(repr, unknown))}. "
                         f"Known keys: {', '.join(field_names())}.")
    return values


def make_config(file=None, **overrides):
    """Config from an optional file, then keyword overrides (None values are ignored)."""
    values = load_config_file(file) if file else {}
    unknown = sorted(set(overrides) - set(field_names()))
    if unknown:
        raise ValueError(f"Unknown config key(s): {', '.join(map(repr, unknown))}.")
    values.update({k: v for k, v in overrides.items() if v is not None})
    return TrainConfig(**values)
