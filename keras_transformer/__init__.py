"""keras-transformer: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

The folders are the floors of the architecture; a module imports only from its own floor and
the floors before it:

    errors, defaults     the error rule and the defaults several commands share
    console              the command's quiet console (native logs hidden unless --verbose)
    hardware             the CPU class and the kernel settings the command picks for it
    layers/              attention, embeddings, feed-forward, encoder, decoder
    models/              the Transformer model and its presets
    runs/                a run directory (Run) and its config (TrainConfig)
    decoding/            greedy and beam search, Translator
    evaluation/          BLEU / chrF, attention pictures
    training/            loss, schedule, optimizer, callbacks, train()
    export/              SavedModel and TFLite
    tasks/               parsing, the Multi30k main job
    cli                  the keras-transformer command

`pipelines` (tf.data input pipelines, the tokenizer, the dataset registry) sits below all of them
and knows nothing of the model.
"""

import importlib
import importlib.abc
import importlib.util
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# The keras-transformer command hides native libraries' logs unless --verbose; this must come
# before TensorFlow is imported below.
from keras_transformer import console, hardware  # noqa: E402

console.quiet_unless_verbose(sys.argv)
# ... and picks TensorFlow's fastest CPU kernels for this CPU class (hardware.py), unless the
# environment already says.
if sys.argv and console.is_the_command(sys.argv[0]):
    hardware.apply_cpu_defaults()

from keras_transformer import layers  # noqa: E402,F401  (registers the layers)
from keras_transformer.models import PAD_ID, PRESETS, Transformer, get_preset, preset_names  # noqa: E402
from keras_transformer.training.loss import LabelSmoothedCrossEntropy  # noqa: E402
from keras_transformer.training.metrics import Perplexity, TokenAccuracy  # noqa: E402
from keras_transformer.training.optimizer import FusedAdam  # noqa: E402,F401  (registers)
from keras_transformer.training.schedule import TransformerSchedule  # noqa: E402

__version__ = "0.2.0"

__all__ = ["LabelSmoothedCrossEntropy", "PAD_ID", "PRESETS", "Perplexity", "TokenAccuracy",
           "Transformer", "TransformerSchedule", "get_preset", "layers", "preset_names"]

# Where the modules of the flat 0.1 layout live now: `import keras_transformer.loss` and the
# like keep working (the same module object under both names).
MOVED_MODULES = {
    "model": "models.transformer", "presets": "models.presets",
    "loss": "training.loss", "metrics": "training.metrics", "schedule": "training.schedule",
    "optimizer": "training.optimizer", "config": "runs.config", "checkpoints": "runs.run",
    "search": "decoding.search", "beam_search": "decoding.beam_search",
    "translate": "decoding.translate",
    "attention_maps": "evaluation.attention_maps", "parsing": "tasks.parsing",
    "evalb": "tasks.evalb", "main_job": "tasks.main_job",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves `keras_transformer.<old name>` to the module's new place."""

    def find_spec(self, fullname, path=None, target=None):
        prefix, _, name = fullname.partition(".")
        if prefix != __name__ or name not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    _ATTRIBUTES = ("__name__", "__spec__", "__loader__", "__package__", "__file__",
                   "__cached__")

    def create_module(self, spec):
        module = importlib.import_module(
            f"{__name__}.{MOVED_MODULES[spec.name.split('.', 1)[1]]}")
        self._saved = {key: getattr(module, key) for key in self._ATTRIBUTES
                       if hasattr(module, key)}
        return module

    def exec_module(self, module):
        # The import system labelled the module with the old name; it keeps its own.
        for key, value in self._saved.items():
            setattr(module, key, value)


sys.meta_path.append(_MovedModuleFinder())
