"""The training settings, each declared once (`runs.settings.setting`: default, help,
allowed values, whether a resumed run may change it), in the sections that follow the
concepts and that a config file holds: `model:` (the preset and the `Transformer`'s own
architecture arguments), `data:`, `optimization:`, `run:`, `parent:` (fine-tuning) and
`distill:` (sequence-level distillation). `TrainConfig` (runs/config.py) puts them together,
loads and merges them.
"""

import dataclasses
import typing

from keras_transformer.defaults import (MAX_LENGTH, SHARD_PAIRS, TRAIN_TOKENS_PER_BATCH,
                                        VOCAB_SIZE)
from keras_transformer.errors import ConfigError
from keras_transformer.models.presets import get_preset, preset_names
from keras_transformer.runs.settings import (PRESET, Range, Section, fraction, non_negative,
                                             positive, setting)
from keras_transformer.runs.pairs import check_pairs, language_pairs
from pipelines.datasets import DATASETS
from pipelines.multilingual import TEMPERATURE as PAIR_TEMPERATURE

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
AUTO = "auto"  # a value resolved for this machine when the config is resolved
STRATEGIES = ("default", "mirrored", "multiworker")
# Dev metrics early stopping and best.keras can follow (training/early_stopping.py).
EARLY_STOPPING_METRICS = ("loss", "bleu", "chrf")
POSITIONAL = ("sinusoidal", "learned")
# Learning-rate schedules (training/schedule.py builds them): the paper's, and those that warm
# up, then decay to 0 at train_steps.
INVERSE_SQRT, WSD = "inverse_sqrt", "wsd"
DECAYING = ("linear", "cosine", WSD)
LR_SCHEDULES = (INVERSE_SQRT, *DECAYING)
WSD_COOLDOWN = 0.25  # the share of the steps wsd's cooldown takes where none is given
# The learned positional table's length where the preset does not give one.
LEARNED_POSITIONS = 512

_PRESET = "default: the preset's"


def _when_set(section):
    """`saved_if` of a setting added after runs were saved: in config.json only when it is not
    its default, so a run that leaves it alone saves the file it always did."""
    del section
    return False


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
    norm_first: Optional[bool] = setting(None, "pre-norm residual blocks and a final "
                                         "LayerNorm on each stack (the paper: post-norm)",
                                         default_text=_PRESET)
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
        from keras_transformer.dimensions import check_dimensions

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
    src_lang: str = setting("en", "source language (several pairs: one for all, or one per "
                            "pair)", prepare=True, many=True)
    tgt_lang: str = setting("de", "target language; several (--tgt-lang de fr cs) train one "
                            "model for every pair, a tag on the source naming the target "
                            "(docs/training.md)", prepare=True, many=True)
    train_src: Optional[str] = setting(None, "dataset text: training source file (plain or "
                                       ".gz); several pairs: one per pair", prepare=True,
                                       many=True)
    train_tgt: Optional[str] = setting(None, "dataset text: training target file (one per "
                                       "pair)", prepare=True, many=True)
    dev_src: Optional[str] = setting(None, "dataset text: dev source file (one per pair)",
                                     many=True)
    dev_tgt: Optional[str] = setting(None, "dataset text: dev target file (one per pair)",
                                     many=True)
    pair_sampling_temperature: float = setting(
        PAIR_TEMPERATURE, "several pairs: pair i is drawn with probability proportional to "
        "(n_i/N)^(1/T) (1: by corpus size; larger: towards uniform)", check=positive,
        prepare=True,
        saved_if=lambda data: data.target_languages is not None)
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
        check_pairs(self)
        if self.tokens_per_batch < self.max_length:
            raise ConfigError(f"Config key 'tokens_per_batch' must be at least max_length="
                              f"{self.max_length}; got {self.tokens_per_batch!r}.")
        if self.dataset == "text":
            for key in ("train_src", "train_tgt"):
                if getattr(self, key) is None:
                    raise ConfigError(f"Config key {key!r} is required with dataset 'text'.")

    @property
    def target_languages(self):
        """The targets of a run of several pairs, in order (None for one pair)."""
        return list(self.tgt_lang) if isinstance(self.tgt_lang, list) else None

    def pairs(self):
        """The language pairs, one `Pair` each, in the order of tgt_lang."""
        return language_pairs(self)


@dataclasses.dataclass
class OptimizationSettings(Section):
    """The optimizer, its schedule, the loss and the numerics (paper Section 5)."""

    train_steps: Optional[int] = setting(None, "optimizer steps (a run whose lr_schedule "
                                         "decays to 0 at train_steps cannot change them when "
                                         "it resumes)", check=positive, resumable=True,
                                         default_text=_PRESET)
    warmup_steps: Optional[int] = setting(None, "learning-rate warmup steps (paper 4000)",
                                          check=positive, default_text=_PRESET)
    label_smoothing: Optional[float] = setting(None, "eps_ls (paper 0.1)", check=fraction,
                                               default_text=_PRESET)
    lr_schedule: str = setting(
        INVERSE_SQRT, "learning-rate schedule: inverse_sqrt (the paper's: warmup, then "
        "step^-0.5), or warmup then a decay to 0 at train_steps: linear, cosine, or wsd (the "
        "peak held, then a linear cooldown over the last cooldown_fraction of the steps)",
        choices=LR_SCHEDULES, saved_if=_when_set)
    peak_lr: Optional[float] = setting(
        None, "the learning rate at the end of the warmup (lr_scale multiplies it)",
        check=positive,
        default_text="default: the paper schedule's, (d_model * warmup_steps)^-0.5",
        saved_if=_when_set)
    cooldown_fraction: Optional[float] = setting(
        None, "wsd: the share of train_steps its cooldown takes",
        check=Range(0, 1, low_open=True), default_text=f"default {WSD_COOLDOWN} with wsd",
        saved_if=_when_set)
    lr_scale: float = setting(1.0, "multiplier on the learning rate of every lr_schedule",
                              check=positive)
    clip_norm: Optional[float] = setting(None, "clip the gradients to this global norm",
                                         check=positive, default_text="default off",
                                         saved_if=_when_set)
    ema_momentum: Optional[float] = setting(
        None, "keep an exponential moving average of the weights with this momentum (0.999: "
        "about the last 1000 steps); model.keras holds the average, checkpoints the trained "
        "weights and the average", check=Range(0, 1, low_open=True, high_open=True),
        default_text="default off", saved_if=_when_set)
    grad_accum_steps: int = setting(1, "batches per optimizer update", check=positive)
    precision: str = setting(AUTO, "Keras dtype policy; auto: mixed_bfloat16 on CPUs with bf16 "
                             "(avx512_bf16, AMX) and GPUs with bf16 under JAX, else float32. "
                             "Variables, the loss and the softmax stay float32",
                             choices=(AUTO, *POLICIES))
    xla: bool = setting(False, "compile the training step with XLA")
    seed: int = setting(1234, "random seed (data order, initialization, dropout)",
                        prepare=True)

    def validate(self):
        super().validate()
        if self.lr_schedule in DECAYING and None not in (self.warmup_steps, self.train_steps) \
                and self.warmup_steps >= self.train_steps:
            raise ConfigError(f"lr_schedule {self.lr_schedule!r} warms up, then decays to 0 at "
                              f"train_steps={self.train_steps}: warmup_steps="
                              f"{self.warmup_steps} must be fewer (--warmup-steps).")
        if self.cooldown_fraction is not None and self.lr_schedule != WSD:
            raise ConfigError(f"Config key 'cooldown_fraction' is a setting of lr_schedule "
                              f"'wsd'; this run's is {self.lr_schedule!r}: leave it out, or "
                              "give --lr-schedule wsd.")


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
