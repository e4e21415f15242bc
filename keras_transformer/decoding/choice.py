"""What a command decodes a run with: the model file, beam size, length penalty and precision.

Each comes from the command's flag when given, else from the choice saved in the run (its
decoding.json: `Run.decoding()`, written by the main job and by `keras-transformer average`),
else from `defaults.TRANSLATION`; `describe()` says which, in one line. The precision, when
asked for, is resolved for this machine (`decoding.precision`: "auto" is bfloat16 on CPUs with
bf16 units) and described with its reason.

    choice = decoding_choice(run, beam_size=args.beam, precision=args.precision)
    choice.model_file, choice.beam_size, choice.alpha, choice.precision
    print(choice.describe(), file=sys.stderr)
"""

import dataclasses
import pathlib

from keras_transformer.decoding.precision import resolve_precision
from keras_transformer.defaults import TRANSLATION

FLAG = "given"
SAVED = "saved"
DEFAULT = "default"


@dataclasses.dataclass(frozen=True)
class DecodingChoice:
    """The settings a command decodes with, and where each came from.

    Attributes:
        model_file: the model file to load (None: the run loads its own, e.g. an ensemble's
            members).
        model_label: how the model is named to people (a file name, or "the members' models").
        beam_size, alpha: the search's.
        origins: {"model": origin, "beam": origin, "alpha": origin}, each FLAG, SAVED or DEFAULT.
        chosen_by: who saved the run's choice (None when the run has none).
        weights: the saved label of the chosen weights (e.g. "average of the last 5
            checkpoints"), if any.
        precision: "float32" or "bfloat16" (None: not part of the choice, e.g. for another
            engine).
        precision_reason: why, in one line (`precision.resolve_precision`).
    """

    model_file: pathlib.Path | None
    model_label: str
    beam_size: int
    alpha: float
    origins: dict
    chosen_by: str | None = None
    weights: str | None = None
    precision: str | None = None
    precision_reason: str | None = None

    def describe(self, model_label=None):
        """One line: what is used and where it came from, e.g. "decoding with averaged.keras,
        beam 4, alpha 1.0 (chosen by the main job, on val; --model/--beam/--alpha override);
        bf16: this CPU has avx512_bf16; --precision float32 restores float32".
        `model_label` replaces the model's name (e.g. a CTranslate2 export folder)."""
        label = model_label or self.model_label
        if self.weights and self.origins["model"] == SAVED and model_label is None:
            label += f" ({self.weights})"
        groups = {}
        for name, origin in self.origins.items():
            if name != "model" or model_label is None:
                groups.setdefault(origin, []).append(name)
        everything = len(groups) == 1
        parts = []
        if SAVED in groups:
            what = "" if everything else ", ".join(groups[SAVED]) + " "
            parts.append(f"{what}chosen by {self.chosen_by or 'an earlier command'}")
        if FLAG in groups:
            parts.append(", ".join("--" + name for name in groups[FLAG]) + " given")
        if DEFAULT in groups:
            parts.append("the defaults: the run saved no choice" if everything
                         else ", ".join(groups[DEFAULT]) + ": the default")
        line = (f"decoding with {label}, beam {self.beam_size}, alpha {self.alpha} "
                f"({'; '.join(parts)}; --model/--beam/--alpha override)")
        return line + (f"; {self.precision_reason}" if self.precision_reason else "")


def decoding_choice(run, model=None, beam_size=None, alpha=None, search=TRANSLATION,
                    precision=None):
    """The `DecodingChoice` for `run` (a `Run` or `EnsembleRun`): each of `model` (a path),
    `beam_size`, `alpha` where given (not None), else the run's saved choice, else `search`'s
    default (the model: `Run.model_file()`, averaged.keras if present); `precision` ("auto",
    "float32", "bfloat16"; None: left out) resolved for this machine."""
    saved = run.decoding()
    origins = {}
    if model is not None:
        model_file, origins["model"] = pathlib.Path(model), FLAG
        label = str(model)
    else:
        model_file = run.decoding_model_path()
        origins["model"] = (SAVED if saved.get("model") and model_file is not None
                            and model_file.name == saved["model"] else DEFAULT)
        label = model_file.name if model_file is not None else "the members' models"
    values = {}
    for key, name, given, default in (("beam_size", "beam", beam_size, search.beam_size),
                                      ("alpha", "alpha", alpha, search.alpha)):
        if given is not None:
            values[key], origins[name] = given, FLAG
        elif saved.get(key) is not None:
            values[key], origins[name] = saved[key], SAVED
        else:
            values[key], origins[name] = default, DEFAULT
    if precision is not None:
        values["precision"], values["precision_reason"] = resolve_precision(precision)
    return DecodingChoice(model_file=model_file, model_label=label, origins=origins,
                          chosen_by=saved.get("chosen_by"), weights=saved.get("weights"),
                          **values)
