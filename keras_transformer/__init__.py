"""keras-transformer: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

    from keras_transformer import Transformer
    model = Transformer.from_preset("base", vocab_size=37000)

The folders are the floors of the architecture; a module imports only from its own floor and
the floors before it:

    errors, defaults     the error rule and the defaults several commands share
    dimensions           the attention's sizes rule (layers, model and run config)
    hardware             the CPU class and the kernel settings the command picks for it
    layers/              attention, embeddings, feed-forward, encoder, decoder
    models/              the Transformer model and its presets
    runs/                a run directory (Run), its config (TrainConfig) and saved choices
    decoding/            the decoding request, the engines (Translator, CTranslate2), the
                         searches, the file-level translate job (streaming, resumable
                         output, the UTF-8 line policy)
    evaluation/          BLEU / chrF, evaluating a split, attention pictures
    training/            loss, schedule, optimizer, callbacks, train()
    export/              SavedModel, TFLite and CTranslate2
    tasks/               parsing, the Multi30k main job
    cli/                 the keras-transformer command, one module per command family, and
                         its quiet console

`pipelines` (input pipelines, the tokenizer, the dataset registry) sits below all of them and
knows nothing of the model. This file, the package's face, stands on training's floor: the
names it hands on and the classes it registers come from layers, models and training, by
plain imports (each folder's `__init__.py` stands on its folder's floor).

Importing the package registers every class a saved model or run names (the model, the
layers, the loss, the schedule, the optimizer, the metrics, the ensemble) with Keras, as
`import keras_hub` does, so that after `import keras, keras_transformer`

    model = keras.models.load_model("runs/multi30k-en-de-quick/model.keras")

loads a run's model.keras or averaged.keras, compiled or not, with `safe_mode=True`, on
TensorFlow and JAX. Keras finds a custom class only in its registry (it imports the module a
saved config names only for its own packages), so the registering modules are imported here:
`layers`, `models.transformer`, `models.ensemble` and the loss, schedule, optimizer and
metrics of `training` (not the trainer, `export`, `pipelines` or any data code: the model
reads its padding id from `pipelines.special_ids`, five constants). This imports Keras and
its backend, and nothing more: the package itself sets no environment variable, touches no
file descriptor and installs no import hook (Keras and TensorFlow set a few variables of
their own when they load). The other names below are imported when first used.

Where Keras cannot be imported at all (a process or container without TensorFlow), the package
still imports, registering nothing: the decoding request, the CTranslate2 engine and the
`Decoder` of a request for it need neither Keras nor TensorFlow (`Decoder(Request(engine=
"ctranslate2", ctranslate2_model=FOLDER)).engine()`), and the command runs `translate`,
`evaluate` and `score` with `--engine ctranslate2` without importing them.

The `keras-transformer` command sets up its console before TensorFlow loads (TensorFlow reads
its settings then), so its entry point (`keras_transformer_command`, beside the package)
asks the package to wait: while it builds its parser, `import keras_transformer` registers
nothing, and `cli.main` calls `register()` once the console is set up.
"""

import importlib
import sys

__version__ = "0.2.0"


def register():
    """Registers the package's saveable classes with Keras (importing the package does it,
    except while the command line builds its parser). Idempotent.

    Each module imported here registers its classes as it loads
    (`@keras.saving.register_keras_serializable`): the model, its layers and ensemble, and
    the loss, schedule, optimizer and metrics a compiled model or a run names."""
    import keras_transformer.layers  # noqa: F401
    import keras_transformer.models.ensemble  # noqa: F401
    import keras_transformer.models.transformer  # noqa: F401
    import keras_transformer.training.loss  # noqa: F401
    import keras_transformer.training.metrics  # noqa: F401
    import keras_transformer.training.optimizer  # noqa: F401
    import keras_transformer.training.schedule  # noqa: F401


# name -> the module that defines it
_LAZY = {
    "Transformer": "keras_transformer.models",
    "PRESETS": "keras_transformer.models",
    "get_preset": "keras_transformer.models",
    "preset_names": "keras_transformer.models",
    "PAD_ID": "keras_transformer.models",
    "Ensemble": "keras_transformer.models",
    "FusedAdam": "keras_transformer.training.optimizer",
    "LabelSmoothedCrossEntropy": "keras_transformer.training.loss",
    "Perplexity": "keras_transformer.training.metrics",
    "TokenAccuracy": "keras_transformer.training.metrics",
    "TransformerSchedule": "keras_transformer.training.schedule",
}

__all__ = ["Ensemble", "FusedAdam", "LabelSmoothedCrossEntropy", "PAD_ID", "PRESETS",
           "Perplexity", "TokenAccuracy", "Transformer", "TransformerSchedule", "get_preset",
           "layers", "preset_names", "register"]


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    elif name == "layers":
        value = importlib.import_module("keras_transformer.layers")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # imported once
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))


def _register_if_keras():
    """`register()`, unless Keras (or its backend) cannot be imported at all: then the package
    still imports for what needs neither, the CTranslate2 engine and its decoder, and
    whatever needs Keras raises its own ImportError when used."""
    try:
        register()
    except ImportError as error:
        if (error.name or "").split(".")[0] not in _KERAS_MODULES:
            raise


# The top-level modules whose absence leaves the package without Keras (see above).
_KERAS_MODULES = ("keras", "tensorflow", "jax", "jaxlib", "torch")

# The command's entry point sets `waiting` while it builds its parser (see the docstring).
if not getattr(sys.modules.get("keras_transformer_command"), "waiting", False):
    _register_if_keras()
