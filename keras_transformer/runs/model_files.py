"""The Keras model files of a run directory: model.keras (`train`'s final weights),
averaged.keras (the chosen average) and best.keras with its record best.json (the best dev
evaluation so far): a new model of the run's architecture, a file loaded (in float32) or saved
(atomically), its weights assigned to a model of any dtype policy.

`Run` takes these methods from `ModelFiles`, so that a run directory stays one object and only
`Run` (runs/run.py) names the files inside it: the methods use its paths (`model_path`,
`averaged_path`, `best_path`, `best_record_path`), its config and its vocabulary.
"""

import json
import pathlib

from keras_transformer.errors import RunError
from pipelines.files import atomic_path, write_json


def save_keras(model, path):
    """`model.save(path)` (a .keras file), atomically."""
    with atomic_path(path) as temporary:
        model.save(temporary)
    return pathlib.Path(path)


class ModelFiles:
    """The model files of a `Run` (see the module docstring)."""

    def build_model(self):
        """A new, built `Transformer` of the run's architecture and vocabulary."""
        from keras_transformer.models.transformer import Transformer

        model = Transformer(vocab_size=self.vocabulary().vocab_size,
                            **self.config.architecture)
        model.build()
        return model

    def model_file(self, prefer_averaged=True):
        if prefer_averaged and self.averaged_path.is_file():
            return self.averaged_path
        return self.model_path

    def load_model(self, prefer_averaged=True, path=None):
        """The trained model: `path` if given, else averaged.keras (when `prefer_averaged`
        and present), else model.keras. It computes in float32 whatever policy it was trained
        under (a mixed policy keeps float32 variables: nothing is lost); a translator casts it
        to bf16 where it wants."""
        import keras

        from keras_transformer.models import transformer  # noqa: F401  (registers its layers)
        from keras_transformer.models.casting import cast_model

        path = pathlib.Path(path) if path else self.model_file(prefer_averaged)
        if not path.is_file():
            raise RunError(f"{path} not found: is {self.directory} a finished training run?")
        try:
            model = keras.models.load_model(path, compile=False)
        except (OSError, ValueError) as error:
            if path.stat().st_size == 0 or "zip" in str(error).lower():
                raise RunError(f"{path} is damaged ({error}); train again or average the "
                               "checkpoints into a new model file.") from None
            raise
        return cast_model(model, "float32")

    def save_model(self, model, averaged=False, path=None):
        """Saves to `path`, else averaged.keras or model.keras; returns the path."""
        path = pathlib.Path(path) if path else (self.averaged_path if averaged
                                                else self.model_path)
        return save_keras(model, path)

    def has_model(self):
        return self.model_path.is_file()

    def assign_weights(self, model, path):
        """Assigns the weights of `path`, a model file of this run (read in float32), to
        `model`, a built model of any dtype policy (mixed policies keep float32 variables).
        RunError when they do not fit (another architecture or vocabulary)."""
        weights = self.load_model(path=path).weights
        mismatched = [(a.path, tuple(a.shape), tuple(b.shape))
                      for a, b in zip(weights, model.weights) if tuple(a.shape) != tuple(b.shape)]
        if len(weights) != len(model.weights) or mismatched:
            raise RunError(f"{path} does not fit this run's model ({len(weights)} weights "
                           f"against {len(model.weights)}"
                           f"{'; ' + str(mismatched[0]) if mismatched else ''}): the "
                           "architecture or vocabulary differs.")
        for source, target in zip(weights, model.weights):
            target.assign(source.value)
        return pathlib.Path(path)

    # The best model on dev (training/early_stopping.py decides when).
    def save_best(self, model, step, metric, value):
        """Writes best.keras (atomically), then best.json: {"step", "metric", "value"}."""
        save_keras(model, self.best_path)
        write_json(self.best_record_path, {"step": int(step), "metric": metric,
                                           "value": float(value)})
        return self.best_path

    def best(self):
        """The record of best.keras ({"step", "metric", "value"}), or None when the run has
        none (or best.keras is missing)."""
        if not (self.best_path.is_file() and self.best_record_path.is_file()):
            return None
        try:
            return json.loads(self.best_record_path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise RunError(f"{self.best_record_path} is damaged (not JSON: {error}).") from None
