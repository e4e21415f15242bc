"""`keras-transformer train` and `prepare`: their flags are generated from the settings'
declarations (`keras_transformer.runs.config`), one per setting, each defaulting to "not
given" so that a resumed run compares only what the command line says."""

import functools


def register(commands, config_class=None):
    """Adds the `train` and `prepare` sub-commands (flags from `config_class`'s settings)."""
    from keras_transformer.runs.config import TrainConfig

    config_class = config_class or TrainConfig
    train = commands.add_parser(
        "train",
        help="train a model with model.fit (the paper's recipe)",
        description="Trains a Transformer with Adam and the paper's warmup schedule, "
        "label-smoothed loss, token-budget batches, periodic checkpoints and dev evaluation. "
        "Run the same command again to resume a stopped run from its last checkpoint; "
        "`train --output-dir RUN_DIR --train-steps N` extends a run with its saved settings "
        "(only the flags given are compared with them; a run that stopped early trains on only "
        "with --continue-stopped). On SIGTERM or SIGINT (preemption) it "
        "finishes the step, saves a checkpoint and exits with status 75; a second process "
        "writing the same run is refused (docs/reliability.md). With --dataset text, training or "
        "dev files with no sentence pair to read (empty, or every pair with an empty side) "
        "are refused, naming them, before anything is written.",
    )
    train.add_argument("--config", help="YAML or JSON file with the settings below, by "
                       "section (model:, data:, optimization:, run:) or as flat keys; flags "
                       "override it")
    train.add_argument("--no-tune", action="store_true",
                       help="skip the tuning at the end: by default a run with a dev set "
                       "then chooses its weights, alpha and repetition controls on the first "
                       "500 dev sentences, as `keras-transformer tune --run-dir RUN_DIR` does "
                       "(RUN_DIR/decoding.json)")
    train.add_argument("--continue-stopped", action="store_true",
                       help="train on a run that stopped early (--early-stopping-patience): "
                       "its patience counts again from where it stopped; without it such a "
                       "run says that it stopped and trains no further")
    config_class.add_flags(train)
    train.set_defaults(run=functools.partial(_train, config_class=config_class))

    prepare = commands.add_parser(
        "prepare",
        help="tokenize a training corpus once into the data cache (train does it when needed)",
        description="Reads a dataset's training pairs, trains the shared vocabulary on a "
        "bounded sample, tokenizes on every core and writes shards of integer ids with the "
        "corpus statistics into the data cache, where every run on the same corpus, vocabulary "
        "settings and max_length finds them. A killed prepare, started again, keeps its "
        "finished shards. Prints a summary and, last, the prepared folder.",
    )
    prepare.add_argument("--config", help="YAML or JSON file with any of the keys below "
                         "(a training config works: the other settings are not used)")
    prepare.add_argument("--check", action="store_true",
                         help="verify the checksum of every shard of data found prepared, and "
                         "prepare damaged ones again (missing or truncated shards are always "
                         "found)")
    config_class.add_flags(prepare, prepare=True)
    prepare.set_defaults(run=functools.partial(_prepare, config_class=config_class))


def _config(args, config_class):
    from keras_transformer.runs.config import make_config
    from keras_transformer.runs.settings import FLAG

    return make_config(args.config, config_class=config_class, origin=FLAG,
                       **config_class.given(args))


def _train(args, config_class):
    import contextlib
    import os

    from keras_transformer.runs import Run

    config = _config(args, config_class)
    # The run's lock before TensorFlow is imported: a second writer is refused in a second.
    # (Under multiworker, TF_CONFIG, only the chief locks, which the trainer knows.)
    multiworker = config.strategy == "multiworker" or "TF_CONFIG" in os.environ
    lock = Run(config.output_dir).lock("training", create=True)
    with contextlib.nullcontext() if multiworker else lock:
        from keras_transformer.tasks import stages
        from keras_transformer.training.trainer import train

        summary = train(config, continue_stopped=args.continue_stopped)
        if not (args.no_tune or multiworker):
            stages.tune_trained(Run(config.output_dir), "model" in summary, config.verbose > 0)


def _prepare(args, config_class):
    from pipelines import datasets, prepared

    config = _config(args, config_class)
    data = datasets.prepare_training_data(config.dataset, **config.prepared_data_arguments(),
                                          progress=config.verbose > 0, verify=args.check)
    print(prepared.describe(data))
    print(data.directory)
