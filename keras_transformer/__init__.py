"""keras-transformer: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

    from keras_transformer import Transformer
    model = Transformer.from_preset("base", vocab_size=37000)

The folders are the floors of the architecture; a module imports only from its own floor and
the floors before it:

    errors, defaults     the error rule and the defaults several commands share
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
knows nothing of the model.

This module only names things: the names below are imported when first used (as Keras and
KerasHub do), so that `import keras_transformer` sets no environment variable, touches no file
descriptor and imports no framework, and `import keras_transformer.layers` imports the layers
alone. The `keras-transformer` command sets up its console itself (`cli.console.setup`).
"""

import importlib

__version__ = "0.2.0"

# name -> the module that defines it
_LAZY = {
    "Transformer": "keras_transformer.models",
    "PRESETS": "keras_transformer.models",
    "get_preset": "keras_transformer.models",
    "preset_names": "keras_transformer.models",
    "PAD_ID": "keras_transformer.models",
    "LabelSmoothedCrossEntropy": "keras_transformer.training.loss",
    "Perplexity": "keras_transformer.training.metrics",
    "TokenAccuracy": "keras_transformer.training.metrics",
    "TransformerSchedule": "keras_transformer.training.schedule",
}

__all__ = ["LabelSmoothedCrossEntropy", "PAD_ID", "PRESETS", "Perplexity", "TokenAccuracy",
           "Transformer", "TransformerSchedule", "get_preset", "layers", "preset_names"]


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
