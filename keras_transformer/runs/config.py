"""A training run's settings, declared once per setting, in sections that follow the concepts.

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

import yaml

from keras_transformer.defaults import (MAX_LENGTH, SHARD_PAIRS, TRAIN_TOKENS_PER_BATCH,
                                        VOCAB_SIZE)
from keras_transformer.errors import ConfigError
from keras_transformer.models.presets import get_preset, preset_names
from keras_transformer.runs.settings import (FILE, FLAG, GIVEN, PRESET, Section, Settings,
                                             fraction, non_negative, positive,
                                             setting)
from pipelines.datasets import DATASETS

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
AUTO = "auto"  # a value resolved for this machine when the config is resolved
STRATEGIES = ("default", "mirrored", "multiworker")
# Dev metrics early stopping and best.keras can follow (training/early_stopping.py).
EARLY_STOPPING_METRICS = ("loss", "bleu", "chrf")
POSITIONAL = ("sinusoidal", "learned")
# The learned positional table's length where the preset does not give one.
LEARNED_POSITIONS = 512

_PRESET = "default: the preset's"


def _known_preset(name):
    return None if name in preset_names() else f"is not a preset ({', '.join(preset_names())})"


Optional = typing.Optional


@dataclasses.dataclass
class ModelSettings(Section):
    """The preset and the `Transformer`'s architecture arguments (all but the vocabulary)."""

    preset: str = setting("small", "model preset (keras-transformer presets); the keys below "
                          "change it", check=_known_preset)
    num_layers: Optional[int] = setting(None, "N, layers in the encoder and in the decoder",
                                        check=positive, default_text=_PRESET)
    d_model: Optional[int] = setting(None, "model width", check=positive, default_text=_PRESET)
    num_heads: Optional[int] = setting(None, "attention heads h", check=positive,
                                       default_text=_PRESET)
    d_ff: Optional[int] = setting(None, "feed-forward inner width", check=positive,
                                  default_text=_PRESET)
    key_dim: Optional[int] = setting(None, "d_k per head", check=positive,
                                     default_text="default d_model / h")
    value_dim: Optional[int] = setting(None, "d_v per head", check=positive,
                                       default_text="default d_model / h")
    dropout: Optional[float] = setting(None, "P_drop", check=fraction, default_text=_PRESET)
    norm_first: Optional[bool] = setting(None, "pre-norm residual blocks (the paper: "
                                         "post-norm)", default_text=_PRESET)
    positional: Optional[str] = setting(None, "positional encoding (the paper: sinusoidal)",
                                        choices=POSITIONAL, default_text=_PRESET)
    max_positions: Optional[int] = setting(None, "learned positional embeddings: positions in "
                                           "the table (the Transformer's max_length)",
                                           check=positive,
                                           default_text=f"{LEARNED_POSITIONS} when learned")

    def architecture(self):
        """The `Transformer` arguments (all but the vocabulary size)."""
        values = dataclasses.asdict(self)
        del values["preset"]
        values["max_length"] = values.pop("max_positions")
        return values

    def resolved(self, sources):
        """A copy with the preset's values where none was set (recorded in `sources`), the
        head dimensions computed and checked by the layers' own rule."""
        from keras_transformer.layers.encoder import check_dimensions

        values = dataclasses.asdict(self)
        preset = get_preset(self.preset)["model"]
        preset["max_positions"] = preset.pop("max_length", None)
        preset.setdefault("norm_first", False)
        for key, value in preset.items():
            if values[key] is None and value is not None:
                values[key] = value
                sources.setdefault(key, PRESET)
        if values["positional"] == "learned" and values["max_positions"] is None:
            values["max_positions"] = LEARNED_POSITIONS
        for key in ("key_dim", "value_dim"):
            if values[key] is None:
                sources.setdefault(key, "d_model / h")
        try:
            values["key_dim"], values["value_dim"] = check_dimensions(
                values["d_model"], values["num_heads"], values["key_dim"], values["value_dim"])
        except ValueError as error:
            raise ConfigError(f"Config keys d_model/num_heads/key_dim/value_dim: {error}") \
                from None
        return ModelSettings(**values)


@dataclasses.dataclass
class DataSettings(Section):
    """What the model is trained on and how it is cut into batches."""

    dataset: str = setting("multi30k", "multi30k, wmt14, text (your own parallel files) or ptb "
                           "(constituency parsing on the Penn Treebank sample)",
                           choices=DATASETS, prepare=True)
    src_lang: str = setting("en", "source language", prepare=True)
    tgt_lang: str = setting("de", "target language", prepare=True)
    train_src: Optional[str] = setting(None, "dataset text: training source file (plain or "
                                       ".gz)", prepare=True)
    train_tgt: Optional[str] = setting(None, "dataset text: training target file",
                                       prepare=True)
    dev_src: Optional[str] = setting(None, "dataset text: dev source file")
    dev_tgt: Optional[str] = setting(None, "dataset text: dev target file")
    data_dir: Optional[str] = setting(None, "tensorflow-datasets data directory",
                                      location=True, prepare=True)
    source_dir: Optional[str] = setting(
        None, "Multi30k raw files; for ptb the folder of treebank-combined.tar.gz",
        location=True, prepare=True,
        default_text="default ../shared/data/multi30k or ../shared/data/ptb-sample, else "
        "download")
    vocab_size: int = setting(VOCAB_SIZE, "shared subword vocabulary size", check=positive,
                              prepare=True)
    data_cache: Optional[str] = setting(
        None, "folder of prepared (tokenized, sharded) training data, shared by runs on the "
        "same corpus", location=True, prepare=True,
        default_text="default $KERAS_TRANSFORMER_DATA_CACHE, else ~/.cache/keras-transformer/"
        "data")
    prepared_data: Optional[str] = setting(
        None, "train from this prepared folder as it is (the folder `prepare` printed)",
        location=True, default_text="default: found in the data cache")
    shard_pairs: int = setting(SHARD_PAIRS, "source pairs per prepared shard (MultiWorker "
                               "training needs at least one shard per worker)", check=positive,
                               prepare=True)
    tokens_per_batch: int = setting(TRAIN_TOKENS_PER_BATCH, "token budget per side and per "
                                    "replica (paper: 25000)", check=positive)
    max_length: int = setting(MAX_LENGTH, "drop pairs longer than this many tokens",
                              check=positive, prepare=True)
    pad_to_bucket: Optional[bool] = setting(
        None, "static shapes: pad every batch to one of a few fixed shapes (coarse length "
        "cells: 6 on Multi30k), so that a step compiled per batch shape compiles a few times; "
        "the same batches, with more padding", default_text="default auto: on under JAX and "
        "with --xla, where the step is compiled per shape; off on TensorFlow without XLA")

    def validate(self):
        super().validate()
        if self.src_lang == self.tgt_lang:
            raise ConfigError(f"Config key 'tgt_lang' must differ from src_lang; got "
                              f"{self.tgt_lang!r}.")
        if self.tokens_per_batch < self.max_length:
            raise ConfigError(f"Config key 'tokens_per_batch' must be at least max_length="
                              f"{self.max_length}; got {self.tokens_per_batch!r}.")
        if self.dataset == "text":
            for key in ("train_src", "train_tgt"):
                if getattr(self, key) is None:
                    raise ConfigError(f"Config key {key!r} is required with dataset 'text'.")


@dataclasses.dataclass
class OptimizationSettings(Section):
    """The optimizer, its schedule, the loss and the numerics (paper Section 5)."""

    train_steps: Optional[int] = setting(None, "optimizer steps", check=positive,
                                         resumable=True, default_text=_PRESET)
    warmup_steps: Optional[int] = setting(None, "learning-rate warmup steps (paper 4000)",
                                          check=positive, default_text=_PRESET)
    label_smoothing: Optional[float] = setting(None, "eps_ls (paper 0.1)", check=fraction,
                                               default_text=_PRESET)
    lr_scale: float = setting(1.0, "multiplier on the paper's learning rate", check=positive)
    grad_accum_steps: int = setting(1, "batches per optimizer update", check=positive)
    precision: str = setting(AUTO, "Keras dtype policy; auto: mixed_bfloat16 on CPUs with bf16 "
                             "(avx512_bf16, AMX) and GPUs with bf16 under JAX, else float32. "
                             "Variables, the loss and the softmax stay float32",
                             choices=(AUTO, *POLICIES))
    xla: bool = setting(False, "compile the training step with XLA")
    seed: int = setting(1234, "random seed (data order, initialization, dropout)",
                        prepare=True)


@dataclasses.dataclass
class RunSettings(Section):
    """Where the run lives, how it runs, and its checkpoints, evaluation and logging."""

    output_dir: str = setting("runs/multi30k-en-de", "run directory: config, vocabulary, "
                              "checkpoints, logs, model", location=True)
    strategy: str = setting("default", "default, mirrored (local GPUs or logical CPUs) or "
                            "multiworker (TF_CONFIG)", choices=STRATEGIES)
    num_replicas: int = setting(2, "mirrored on a CPU-only host: logical CPU devices",
                                check=positive)
    checkpoint_minutes: float = setting(10.0, "save a checkpoint every N minutes (paper: 10)",
                                        check=positive, resumable=True)
    checkpoint_steps: Optional[int] = setting(None, "also save every N steps", check=positive,
                                              resumable=True)
    keep_checkpoints: int = setting(5, "keep the last K checkpoints", check=positive,
                                    resumable=True)
    checkpoint_on_signal: bool = setting(True, "on SIGTERM or SIGINT, finish the step, save a "
                                         "checkpoint and exit with status 75 (preemption; "
                                         "docs/reliability.md)", resumable=True)
    eval_steps: int = setting(500, "dev loss every N steps (also the progress-bar epoch)",
                              check=positive, resumable=True)
    log_steps: int = setting(50, "TensorBoard: training loss, learning rate and tokens/s "
                             "every N steps (RUN/logs/train)", check=positive, resumable=True)
    bleu_steps: Optional[int] = setting(None, "greedy dev sacreBLEU every N steps",
                                        check=positive, resumable=True,
                                        default_text="default off")
    bleu_sentences: int = setting(200, "dev sentences used for that BLEU", check=positive,
                                  resumable=True)
    time_limit_minutes: Optional[float] = setting(None, "stop after this much training time",
                                                  check=positive, resumable=True,
                                                  default_text="default none")
    early_stopping_metric: str = setting(
        "loss", "the dev metric for early stopping and best.keras: loss (every eval_steps), "
        "or bleu or chrf of the greedy dev translation (every bleu_steps)",
        choices=EARLY_STOPPING_METRICS)
    early_stopping_patience: int = setting(
        0, "stop after N evaluations without an improvement of at least "
        "early_stopping_min_delta; 0: never", check=non_negative, resumable=True,
        default_text="default 0: off")
    early_stopping_min_delta: float = setting(
        0.0, "the least change of the metric that counts as an improvement", check=non_negative,
        resumable=True)
    keep_best: Optional[bool] = setting(
        None, "write best.keras (and best.json: step, metric) whenever the dev metric improves",
        resumable=True, default_text="default on when there is a dev set")
    verbose: int = setting(1, "0 quiet, 1 a progress bar over the run's steps, 2 also Keras' "
                           "line per eval_steps and third-party logs (TensorFlow, "
                           "sentencepiece, tfds)", resumable=True, prepare=True)

    def validate(self):
        super().validate()
        if self.early_stopping_metric != "loss" and self.bleu_steps is None:
            raise ConfigError(f"Config key 'early_stopping_metric' {self.early_stopping_metric!r} "
                              "follows the greedy dev translation made every bleu_steps: give "
                              "bleu_steps (--bleu-steps N) too, or use the metric 'loss'.")


@dataclasses.dataclass
class ParentSettings(Section):
    """Fine-tuning: the run whose weights this one starts from (runs/parent.py records it)."""

    init_from: Optional[str] = setting(
        None, "fine-tune: start from this run's weights (RUN_DIR, or a .keras model file of "
        "it), with its architecture and vocabulary and a fresh optimizer and schedule "
        "(docs/fine-tuning.md)", default_text="default none: a new model")
    parent_model: Optional[str] = setting(None, "the parent's model file the weights came "
                                          "from (recorded by train)", flag=False)
    parent_config_sha256: Optional[str] = setting(None, "sha256 of the parent's config.json "
                                                  "(recorded by train)", flag=False)


@dataclasses.dataclass
class DistillationSettings(Section):
    """Sequence-level distillation: the teachers whose translations of their training sources
    this run trains on (tasks/distill.py records them)."""

    teachers: Optional[list] = setting(None, "the teacher runs (absolute directories; several: "
                                       "decoded as one ensemble)", flag=False)
    teacher_config_sha256: Optional[dict] = setting(
        None, "sha256 of the config.json of each run decoded ({run directory: sha256})",
        flag=False)
    teacher_decoding: Optional[dict] = setting(
        None, "how the teachers decoded: model files, beam_size, alpha, extra_length, "
        "precision and where each came from", flag=False)


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

    def data_arguments(self):
        """What `pipelines.datasets.load_pairs` needs after the dataset and split."""
        data = self.data
        return dict(src_lang=data.src_lang, tgt_lang=data.tgt_lang, data_dir=data.data_dir,
                    source_dir=data.source_dir,
                    text_files={"train": (data.train_src, data.train_tgt),
                                "dev": (data.dev_src, data.dev_tgt)})

    def prepared_data_arguments(self):
        """What `pipelines.datasets.prepare_training_data` needs after the dataset."""
        data = self.data
        return dict(src_lang=data.src_lang, tgt_lang=data.tgt_lang, cache_dir=data.data_cache,
                    vocab_size=data.vocab_size, seed=self.seed, max_length=data.max_length,
                    shard_pairs=data.shard_pairs, data_dir=data.data_dir,
                    source_dir=data.source_dir, text_files=self.data_arguments()["text_files"])

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


__all__ = ["DataSettings", "DistillationSettings", "FILE", "FLAG", "ModelSettings",
           "OptimizationSettings", "ParentSettings", "RunSettings", "TrainConfig",
           "load_config_file", "make_config", "static_shapes"]
