"""A predict request's JSON -> a checked `Call`, and a call's outputs -> the answer's JSON, as
TensorFlow Serving's REST API reads and writes them (its api_rest.md):

    {"signature_name": "serving_default", "instances": [{"sentences": "A dog."}, ...]}
        -> {"predictions": [{"translations": "Ein Hund.", "scores": -0.41}, ...]}
    {"inputs": {"sentences": ["A dog."], "beam_size": 2}}
        -> {"outputs": {"translations": ["Ein Hund."], "scores": [-0.41]}}

Row format: each instance an object of the signature's inputs; the per-sentence inputs
(sentences, prefixes, constraints, sources, targets) are gathered over the instances, and a
scalar option given in several instances must have one value. Every refusal is a
`ServingError` naming what is wrong: INVALID_ARGUMENT (400) for bad JSON, a wrong type, an
unknown signature or input, an option out of its range (the decoding request's own check and
message, `decoding.request`); TOO_LARGE (413) past a request's limits on lines or words.
"""

import dataclasses
import json
import typing

from keras_transformer.decoding.request import Request
from keras_transformer.errors import InputError
from keras_transformer.serving.errors import TOO_LARGE, ServingError
from keras_transformer.serving.signatures import FLOAT, INT32, NBEST, SAMPLE, STRING

DEFAULT_SIGNATURE = "serving_default"
# The largest beam_size, num_hypotheses or num_samples a request may ask for (the exported
# signatures' bound, export.graph.MAX_BEAM).
MAX_BEAM = 64


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one request may hold: sentences (lines) and whitespace-separated words over all
    its texts; the body's bytes are the app's to count."""

    max_lines: int = 1024
    max_words: int = 65536


@dataclasses.dataclass
class Call:
    """A checked request: its signature, every input's value (the request's, else the
    signature's default) and whether it came in the row format."""

    signature: typing.Any
    values: dict
    rows: bool

    @property
    def kind(self):
        return self.signature.kind

    @property
    def lines(self):
        return len(self.values.get("sentences", self.values.get("sources", [])))

    def languages(self):
        """The target language of each line, or None (a one-pair run)."""
        given = self.values.get("target_language")
        if given is None:
            return None
        return list(given) if len(given) == self.lines else [given[0]] * self.lines

    def search(self):
        """The search options ({option: value}) of a search signature's call."""
        names = ("beam_size", "alpha", "no_repeat_ngram_size", "repetition_penalty")
        return {name: self.values[name] for name in names}


def parse_body(body, table, limits=Limits()):
    """The `Call` of a predict request's body (bytes), its signature among `table`
    ({name: Signature}); raises ServingError."""
    try:
        request = json.loads(body)
    except ValueError as error:  # not JSON, or not UTF-8
        raise ServingError.invalid(f"JSON Parse error: {error}") from None
    if not isinstance(request, dict):
        raise ServingError.invalid("JSON Value: the request must be an object, with "
                                   "'instances' or 'inputs'.")
    name = request.get("signature_name", DEFAULT_SIGNATURE)
    if not isinstance(name, str) or name not in table:
        raise ServingError.invalid(f"Serving signature name: \"{name}\" not found in signature "
                                   f"def; the signatures are {', '.join(sorted(table))}.")
    unknown = sorted(set(request) - {"signature_name", "instances", "inputs"})
    if unknown:
        raise ServingError.invalid(f"unknown request field(s) {unknown}: a request has "
                                   "signature_name and either instances or inputs.")
    if ("instances" in request) == ("inputs" in request):
        raise ServingError.invalid("Missing 'inputs' or 'instances' key" if "inputs" not in
                                   request else "Both 'instances' and 'inputs' keys are "
                                   "specified: give one of them.")
    signature = table[name]
    rows = "instances" in request
    given = (_from_instances(request["instances"], signature, limits) if rows
             else _from_inputs(request["inputs"], signature))
    call = Call(signature, _checked_values(given, signature), rows)
    _check_limits(call, limits)
    _check_options(call)
    return call


def _from_instances(instances, signature, limits):
    """{input: value} gathered from row-format instances."""
    if not isinstance(instances, list):
        raise ServingError.invalid("'instances' must be a list of objects, one per sentence.")
    if len(instances) > limits.max_lines:
        raise ServingError(TOO_LARGE, f"{len(instances)} instances: a request holds at most "
                           f"{limits.max_lines} lines (--max-lines).")
    given = {}
    for number, instance in enumerate(instances):
        if not isinstance(instance, dict):
            raise ServingError.invalid(
                f"instance {number} is {type(instance).__name__}: signature "
                f"{signature.name!r} has several inputs, so each instance is an object of "
                f"them, e.g. {{\"{signature.inputs[0].name}\": ...}}.")
        _known(instance, signature)
        for name, value in instance.items():
            spec = signature.input(name)
            if spec.rank and spec.per_sentence:
                given.setdefault(name, [None] * len(instances))[number] = value
            elif spec.rank:  # target_language: one per instance
                given.setdefault(name, [None] * len(instances))[number] = value
            elif name in given and given[name] != value:
                raise ServingError.invalid(f"{name} is {given[name]!r} in one instance and "
                                           f"{value!r} in another: a request's options have "
                                           "one value.")
            else:
                given[name] = value
    for name, values in list(given.items()):
        spec = signature.input(name)
        if spec.rank and None in values:
            if spec.required or not spec.per_sentence:
                missing = values.index(None)
                raise ServingError.invalid(f"instance {missing} lacks {name!r}, which the "
                                           "others give.")
            given[name] = ["" if v is None else v for v in values]  # no prefix, no constraint
    return given


def _from_inputs(inputs, signature):
    if not isinstance(inputs, dict):
        raise ServingError.invalid(f"'inputs' must be an object of signature "
                                   f"{signature.name!r}'s inputs "
                                   f"({', '.join(signature.input_names)}).")
    _known(inputs, signature)
    return dict(inputs)


def _known(given, signature):
    unknown = sorted(set(given) - set(signature.input_names))
    if unknown:
        raise ServingError.invalid(f"input(s) {unknown} not in signature {signature.name!r}: "
                                   f"its inputs are {', '.join(signature.input_names)}.")


def _checked_values(given, signature):
    """Every input's value, of its type and shape (a request's, else the default)."""
    values = {}
    for spec in signature.inputs:
        if spec.name not in given:
            if spec.required:
                raise ServingError.invalid(f"signature {signature.name!r} needs input "
                                           f"{spec.name!r}.")
            values[spec.name] = spec.default
            continue
        value = given[spec.name]
        if spec.rank and spec.name == "target_language" and isinstance(value, str):
            value = [value]
        if spec.rank:
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ServingError.invalid(f"input {spec.name!r} must be a list of strings, "
                                           f"not {_shown(value)}.")
            for text in value:
                _check_text(spec.name, text)
        elif spec.dtype == INT32 and (isinstance(value, bool) or not isinstance(value, int)):
            raise ServingError.invalid(f"input {spec.name!r} must be an integer, not "
                                       f"{_shown(value)}.")
        elif spec.dtype == FLOAT and (isinstance(value, bool)
                                      or not isinstance(value, (int, float))):
            raise ServingError.invalid(f"input {spec.name!r} must be a number, not "
                                       f"{_shown(value)}.")
        values[spec.name] = value
    return values


def _check_text(name, text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate escaped in the JSON ("\ud800")
        raise ServingError.invalid(f"input {name!r} holds a string that is not valid UTF-8 "
                                   f"(a lone surrogate): {text[:40]!r}.") from None


def _shown(value):
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_limits(call, limits):
    values, lines = call.values, call.lines
    if lines > limits.max_lines:
        raise ServingError(TOO_LARGE, f"{lines} lines: a request holds at most "
                           f"{limits.max_lines} lines (--max-lines).")
    for name in ("prefixes", "constraints", "targets"):
        given = values.get(name)
        if given is not None and (len(given) != lines if name == "targets" else
                                  given and len(given) != lines):
            raise ServingError.invalid(f"{name} must give one string per sentence: {lines} "
                                       f"sentences, {len(given)} {name}.")
    languages = values.get("target_language")
    if languages is not None and len(languages) not in (1, lines):
        raise ServingError.invalid(f"target_language must give one language, or one per "
                                   f"sentence: {lines} sentences, {len(languages)} languages.")
    words = sum(len(text.split()) for spec in call.signature.inputs
                if spec.dtype == STRING and spec.per_sentence
                for text in values[spec.name])
    if words > limits.max_words:
        raise ServingError(TOO_LARGE, f"{words} words: a request holds at most "
                           f"{limits.max_words} whitespace-separated words over its texts "
                           "(--max-words).")


def _check_options(call):
    """The decoding request's own checks of the options (ranges, modes, constraints need a
    beam), with its messages; then the signatures' bounds."""
    values = call.values
    try:
        if call.kind == SAMPLE:
            Request(sample=True, **{name: values[name] for name in (
                "num_samples", "top_k", "top_p", "temperature", "seed")})
        elif "beam_size" in values:
            Request(**call.search(),
                    constraints=any(c.strip() for c in values["constraints"]))
    except InputError as error:
        raise ServingError.invalid(str(error)) from None
    for name in ("beam_size", "num_hypotheses", "num_samples"):
        if name in values and values[name] > MAX_BEAM:
            raise ServingError.invalid(f"{name}={values[name]} is over {MAX_BEAM}, the "
                                       "largest a request may ask for.")
    if call.kind == NBEST and not 1 <= values["num_hypotheses"] <= values["beam_size"]:
        raise ServingError.invalid(f"num_hypotheses={values['num_hypotheses']} must be from 1 "
                                   f"to beam_size={values['beam_size']}.")


def answer(call, outputs):
    """The answer's JSON object of a call's outputs ({output: one value per line}): a row
    request's `predictions` (an object per line), a columnar one's `outputs`."""
    if call.rows:
        names = sorted(outputs)
        return {"predictions": [dict(zip(names, row)) for row in
                                zip(*(outputs[name] for name in names))]}
    return {"outputs": outputs}
