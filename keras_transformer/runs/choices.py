"""The decoding choices saved in a run: RUN_DIR/decoding.json, read and written by
`Run.decoding` and `Run.save_decoding` (runs/run.py).

    {"format_version": 3, "model": "averaged.keras", "weights": "average of the last 5
     checkpoints", "beam_size": 4, "alpha": 1.0, "no_repeat_ngram_size": 0,
     "repetition_penalty": 1.0, "chosen_by": "the main job, on val",
     "tries": [{"search": "greedy", "weights": "final weights", "sacrebleu": 36.1}, ...]}

Every key but the format version may be absent; "model" names a .keras file inside the run
(or is null); "tries" lists what the choice was made among (`tasks/tuning.py`: every setting
tried on the dev sentences with its figures, in the order tried), for people to read: a choice
saved without tries drops those of the choice before it. The job or command that chose them
writes them through the decoder (`decoding.decoder.Decoder.save_choice`), and the commands
that decode take them as their defaults.
"""

import json

from keras_transformer.errors import RunError
from pipelines.files import write_json

# Version 2 added the repetition controls: a file without them (version 1) decodes with them
# off; version 3 added the tries. A file is written as the lowest version that holds its keys,
# so that an older keras-transformer still reads what it can (and asks to upgrade otherwise).
FORMAT_VERSION = 3
REPETITION_KEYS = ("no_repeat_ngram_size", "repetition_penalty")
TRIES = "tries"
KEYS = ("model", "weights", "beam_size", "alpha", *REPETITION_KEYS, "chosen_by", TRIES)


def checked(choices):
    """`choices` with their keys and texts checked: ValueError names a key that is unknown or
    a text of the wrong kind. Returns a copy. The decoding options among them (beam_size,
    alpha, the repetition controls) are checked by their declaration, when the decoder reads
    or saves them (`decoding.decoder.Decoder`)."""
    unknown = sorted(set(choices) - set(KEYS))
    if unknown:
        raise ValueError(f"unknown decoding choice(s) {unknown}; the choices are {list(KEYS)}.")
    values = dict(choices)
    for key in ("model", "weights", "chosen_by"):
        if values.get(key) is not None and not isinstance(values[key], str):
            raise ValueError(f"{key} must be a text or null; got {values[key]!r}.")
    _check_tries(values.get(TRIES))
    model = values.get("model")
    if model is not None and (not model.endswith(".keras") or "/" in model or "\\" in model
                              or model.startswith(".")):
        raise ValueError(f"model must name a .keras file inside the run; got {model!r}.")
    return values


def _check_tries(tries):
    """ValueError unless `tries` is None or a list of flat objects (texts, numbers, null)."""
    if tries is None:
        return
    flat = (str, int, float, type(None))
    if not isinstance(tries, list) or not all(
            isinstance(one, dict) and all(isinstance(key, str) and isinstance(value, flat)
                                          for key, value in one.items()) for one in tries):
        raise ValueError(f"{TRIES} must be a list of objects of texts and numbers; got "
                         f"{str(tries)[:80]!r}.")


def version_of(choices):
    """The lowest format version that holds `choices`' keys."""
    if TRIES in choices:
        return 3
    return 2 if any(key in choices for key in REPETITION_KEYS) else 1


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
    format version; the tries saved before go unless `choices` has its own. Returns the merged
    choices."""
    merged = {key: value for key, value in read_choices(path).items() if key != TRIES}
    merged.update(checked(choices))
    write_json(path, {"format_version": version_of(merged), **merged})
    return merged
