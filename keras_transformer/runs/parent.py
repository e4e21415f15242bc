"""Fine-tuning: a run that starts from another run's weights (`train --init-from PARENT`).

    config = with_parent(make_config(init_from="runs/multi30k-en-de", dataset="text", ...))
    config.parent_model, config.parent_config_sha256     # recorded in the child's config.json
    config, parent = start_child(requested, resumes)   # what runs/start.py asks, once
    parent.vocabulary, parent.model                      # checked: the parent's spm.model, weights

The child is a run of its own (own directory, checkpoints, optimizer, schedule, steps) that
has its parent's architecture and vocabulary: its new data are tokenized with the parent's
vocabulary (the prepared-data cache keys data made with a given vocabulary by its sha256), and
its model starts from the parent's weights, read as float32 whatever precision the parent
trained in. What cannot change (`FIXED`: the architecture and the vocabulary size) is refused
by name when the command asks for another value; everything else (data, steps, warmup,
lr_scale, label smoothing, dropout, precision) is the child's own.

PARENT is a run directory, whose model is the one chosen for decoding (`Run.
decoding_model_path`: decoding.json's, else averaged.keras, else model.keras), or a .keras
file inside a run directory. The child's config records the path as given (absolute), the
model file used and the sha256 of the parent's config.json. A child that resumes restores its
own checkpoints and never reads the parent again; one stopped before its first checkpoint
starts again from the recorded model file, after checking that the parent's config.json is
still the one recorded.
"""

import dataclasses
import hashlib
import os
import pathlib

from keras_transformer.errors import ConfigError, RunError
from keras_transformer.runs.sections import ModelSettings
from keras_transformer.runs.run import Run

# Settings a child takes from its parent and may not change: the whole architecture (the
# model section but dropout, a training setting that no weight depends on) and the
# vocabulary size. The languages default to the parent's.
FIXED = tuple(field.name for field, *_ in ModelSettings.declarations()
              if field.name != "dropout") + ("vocab_size",)
INHERITED = ("src_lang", "tgt_lang", "dropout")
PARENT = "parent"  # the source of a value taken from the parent, in the effective config


def config_digest(run):
    """sha256 of a run's config.json (what the child records of its parent)."""
    return hashlib.sha256(run.config_path.read_bytes()).hexdigest()


def locate(path):
    """(parent `Run`, its model file) of `--init-from PATH`: a run directory (its model for
    decoding) or a .keras file inside one. ConfigError says what is wrong with PATH."""
    path = pathlib.Path(os.path.abspath(path))
    if path.suffix == ".keras":
        if not path.is_file():
            raise ConfigError(f"--init-from {path}: no such model file.")
        run = Run(path.parent)
        model = path
    else:
        if not path.is_dir():
            raise ConfigError(f"--init-from {path}: no such run directory (give a training "
                              "run's directory or a .keras file in it).")
        run = Run(path)
    if not run.is_run():
        raise ConfigError(f"--init-from {path}: {run.directory} is not a training run "
                          f"directory (no {Run.CONFIG}).")
    if path.suffix != ".keras":
        model = run.decoding_model_path()
        if not model.is_file():
            raise ConfigError(f"--init-from {path}: the run has no model file ({model.name}); "
                              "train it to the end, or give one of its .keras files.")
    if not run.tokenizer_path.is_file():
        raise ConfigError(f"--init-from {path}: the run has no vocabulary "
                          f"({run.tokenizer_path}).")
    return run, model


def with_parent(requested):
    """`requested` (a config, not resolved) as the config of a child of `requested.init_from`:
    the parent's architecture and vocabulary size, its languages unless given, the record of
    the parent (init_from made absolute, parent_model, parent_config_sha256). A config without
    init_from is returned as it is.

    A child run that exists already with this very init_from keeps its record (resuming never
    reads the parent again; `TrainConfig.continued` compares the rest). ConfigError names
    every setting of `FIXED` that the command gives a value other than the parent's."""
    if requested.init_from is None:
        return requested
    init_from = os.path.abspath(requested.init_from)
    child = Run(requested.output_dir)
    if child.is_run() and child.config.init_from == init_from:
        return _replaced(requested, {"init_from": init_from}, keep_source=True)
    parent, model = locate(init_from)
    saved = parent.config
    given = {key for key, source in requested.sources.items() if source != PARENT}
    refused = [f"{key} {getattr(requested, key)!r} (the parent's: {getattr(saved, key)!r})"
               for key in FIXED if key in given and getattr(requested, key) is not None
               and getattr(requested, key) != getattr(saved, key)]
    if refused:
        raise ConfigError(f"--init-from {init_from}: a fine-tuned run keeps its parent's "
                          f"architecture and vocabulary; these cannot change: "
                          f"{', '.join(refused)}. Leave them out.")
    values = {key: getattr(saved, key) for key in FIXED + INHERITED if key not in given}
    config = _replaced(requested, values)
    return _replaced(config, {"init_from": init_from, "parent_model": str(model),
                              "parent_config_sha256": config_digest(parent)}, keep_source=True)


def _replaced(config, values, keep_source=False):
    """`config.replaced(**values)`, the values marked as the parent's (or keeping the source
    they had: init_from stays the command's)."""
    replaced = config.replaced(**values)
    if not keep_source:
        replaced.sources.update({key: PARENT for key in values})
    return replaced


@dataclasses.dataclass(frozen=True)
class ParentStart:
    """What a child that starts now (it has no checkpoint to resume from) takes from its
    parent, located and checked once: the model file of its weights and its vocabulary.

    Attributes:
        run: the parent `Run`.
        model: the parent's model file that the child's weights start from.
        vocabulary: the parent's sentencepiece model, which the child takes before its data
            are prepared (so that they are tokenized with it).
        vocabulary_record: what the child's vocab/spm.json says of it (the parent, sha256).
    """

    run: Run
    model: pathlib.Path
    vocabulary: pathlib.Path
    vocabulary_record: dict


def start_child(requested, resumes):
    """The config a run trains with, and what it takes from its parent now: `requested` as
    `with_parent` makes it, and a checked `ParentStart`, or None for a run that is no child
    or that resumes from checkpoints of its own (`resumes()`, asked of a child only: the
    parent is then not read again).

    This is what `runs.start.RunStart` asks of this module, once, before training."""
    config = with_parent(requested)
    if config.init_from is None or resumes():
        return config, None
    parent = _recorded_parent(config)
    return config, ParentStart(parent, pathlib.Path(config.parent_model), parent.tokenizer_path, {
        "parent": str(parent.directory),
        "sha256": hashlib.sha256(parent.tokenizer_path.read_bytes()).hexdigest()})


def _recorded_parent(config):
    """The parent `Run` that `config` recorded, checked: RunError when its model file is gone
    or its config.json changed since the child recorded it."""
    path = pathlib.Path(config.parent_model)
    parent = Run(path.parent)
    if not path.is_file() or not parent.is_run():
        raise RunError(f"{path}, the parent model this run starts from, is gone: restore it, "
                       "or train into a new output directory.")
    if config_digest(parent) != config.parent_config_sha256:
        raise RunError(f"{parent.config_path} changed since this run recorded it as its "
                       "parent (another sha256): train into a new output directory.")
    return parent


def initialize(model, config):
    """Assigns the parent's weights (its recorded model file, read in float32) to `model`, a
    built model of the child (any dtype policy: mixed policies keep float32 variables).
    RunError when the parent's config.json changed since the child recorded it, or when the
    weights do not fit (another architecture or vocabulary).

    Returns:
        the model file the weights came from.
    """
    return _recorded_parent(config).assign_weights(model, config.parent_model)
