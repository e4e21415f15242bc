"""The decoding choices saved in a run: RUN_DIR/decoding.json, read and written by
`Run.decoding` and `Run.save_decoding` (runs/run.py).

    {"format_version": 1, "model": "averaged.keras", "weights": "average of the last 5
     checkpoints", "beam_size": 4, "alpha": 1.0, "chosen_by": "the main job, on val"}

Every key but the format version may be absent; "model" names a .keras file inside the run
(or is null). The job or command that chose them writes them, and the commands that decode
take them as their defaults.
"""

import json

from keras_transformer.errors import RunError
from pipelines.files import write_json

FORMAT_VERSION = 1
KEYS = ("model", "weights", "beam_size", "alpha", "chosen_by")


def checked(choices):
    """`choices` with their values checked: ValueError names a key that is unknown or a value
    of the wrong kind. Returns a copy, alpha as a float."""
    unknown = sorted(set(choices) - set(KEYS))
    if unknown:
        raise ValueError(f"unknown decoding choice(s) {unknown}; the choices are {list(KEYS)}.")
    values = dict(choices)
    for key in ("model", "weights", "chosen_by"):
        if values.get(key) is not None and not isinstance(values[key], str):
            raise ValueError(f"{key} must be a text or null; got {values[key]!r}.")
    model = values.get("model")
    if model is not None and (not model.endswith(".keras") or "/" in model or "\\" in model
                              or model.startswith(".")):
        raise ValueError(f"model must name a .keras file inside the run; got {model!r}.")
    beam = values.get("beam_size")
    if "beam_size" in values and (isinstance(beam, bool) or not isinstance(beam, int)
                                  or beam < 1):
        raise ValueError(f"beam_size must be an integer of at least 1; got {beam!r}.")
    alpha = values.get("alpha")
    if "alpha" in values:
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or alpha < 0:
            raise ValueError(f"alpha must be a number of at least 0; got {alpha!r}.")
        values["alpha"] = float(alpha)
    return values


def read_choices(path):
    """The choices in `path` (without the format version); {} when there is no such file.
    RunError names the file when it is damaged or newer than this keras-transformer reads."""
    if not path.is_file():
        return {}
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RunError(f"{path} is damaged (not JSON: {error}).") from None
    if not isinstance(values, dict):
        raise RunError(f"{path} is damaged (not a JSON object).")
    version = values.pop("format_version", None)
    if not isinstance(version, int) or isinstance(version, bool):
        raise RunError(f"{path} is damaged (no format_version).")
    if version > FORMAT_VERSION:
        raise RunError(f"{path} has format version {version!r}, newer than this "
                       f"keras-transformer reads ({FORMAT_VERSION}): upgrade it.")
    try:
        return checked(values)
    except ValueError as error:
        raise RunError(f"{path} is damaged ({error})") from None


def save_choices(path, **choices):
    """Merges `choices` (checked) into those in `path` and writes them atomically with the
    format version. Returns the merged choices."""
    merged = {**read_choices(path), **checked(choices)}
    write_json(path, {"format_version": FORMAT_VERSION, **merged})
    return merged
