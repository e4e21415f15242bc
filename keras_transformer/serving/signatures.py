"""The text signatures of the run's SavedModel (`export.text_signatures`) as `serve` answers
them: the same names, inputs, dtypes, shapes and defaults, so that a client written for the
SavedModel in TensorFlow Serving sends the same JSON here.

    serving_default   sentences [, beam_size, alpha, prefixes, constraints, target_language,
                      no_repeat_ngram_size, repetition_penalty] -> translations, scores
    translate_nbest   the same and num_hypotheses -> translations (N, H), scores (N, H)
    sample            sentences [, num_samples, top_k, top_p, temperature, seed, prefixes,
                      target_language] -> translations (N, S), scores (N, S)
    score             sources, targets [, target_language] -> log_prob, tokens, mean

`target_language` is an input only for a run of several target languages, as in its export.
The options' dtypes and defaults come from the decoding request's declaration
(`decoding.request.signature_input`), beam_size and alpha from the run's saved choice, as the
export takes them, and the repetition controls too (`serve` searches as `translate` does; the
export's repetition inputs default to off); tests/test_serve_api.py holds them against a SavedModel's SignatureDefs.
Declared here rather than read from an export: the server runs without TensorFlow.
"""

import dataclasses
import typing

from keras_transformer.decoding.request import signature_input

STRING, INT32, FLOAT = "DT_STRING", "DT_INT32", "DT_FLOAT"
DTYPES = {"int32": INT32, "float32": FLOAT}
SEARCH, NBEST, SAMPLE, SCORE = "search", "nbest", "sample", "score"
REQUIRED = object()  # an input without a default
METHOD = "tensorflow/serving/predict"


@dataclasses.dataclass(frozen=True)
class Input:
    """One input: a scalar (rank 0) or a vector (rank 1, one value per sentence unless
    `per_sentence` is False), its default (REQUIRED: none)."""

    name: str
    dtype: str
    rank: int
    default: typing.Any = REQUIRED
    per_sentence: bool = True

    @property
    def required(self):
        return self.default is REQUIRED


@dataclasses.dataclass(frozen=True)
class Signature:
    """A signature: its name, what it computes (`kind`), its inputs and outputs
    ({name: (dtype, rank)})."""

    name: str
    kind: str
    inputs: typing.Tuple[Input, ...]
    outputs: typing.Dict[str, typing.Tuple[str, int]]

    def input(self, name):
        return next((i for i in self.inputs if i.name == name), None)

    @property
    def input_names(self):
        return [i.name for i in self.inputs]

    def metadata(self):
        """The SignatureDef as TensorFlow Serving's metadata spells it (its JSON of the
        proto, field names kept)."""
        def tensor(name, dtype, rank, tensor_name):
            return {"dtype": dtype, "tensor_shape": {
                "dim": [{"size": "-1", "name": ""}] * rank, "unknown_rank": False},
                "name": tensor_name}

        outputs = sorted(self.outputs)  # a saved function's outputs, in the order TF names them
        return {
            "inputs": {i.name: tensor(i.name, i.dtype, i.rank, f"{self.name}_{i.name}:0")
                       for i in self.inputs},
            "outputs": {name: tensor(name, *self.outputs[name],
                                     f"StatefulPartitionedCall:{outputs.index(name)}")
                        for name in outputs},
            "method_name": METHOD,
            "defaults": {i.name: default_tensor(i) for i in self.inputs if not i.required}}


def default_tensor(spec):
    """A default as the TensorProto's JSON (strings as the proto's base64)."""
    import base64

    values = spec.default if spec.rank else [spec.default]
    shape = {"dim": [{"size": str(len(values)), "name": ""}] if spec.rank else [],
             "unknown_rank": False}
    field = {STRING: "string_val", INT32: "int_val", FLOAT: "float_val"}[spec.dtype]
    if spec.dtype == STRING:
        values = [base64.b64encode(v.encode("utf-8")).decode("ascii") for v in values]
    return {"dtype": spec.dtype, "tensor_shape": shape, field: list(values)}


def option(name, default=None):
    """A request option's scalar input: its dtype and default from the declaration."""
    kind, declared = signature_input(name)
    return Input(name, DTYPES[kind], 0, declared if default is None else default)


def signatures(beam_size, alpha, target_languages=None, no_repeat_ngram_size=None,
               repetition_penalty=None):
    """{name: Signature} of a run whose search defaults to `beam_size` and `alpha` (its saved
    choice, as its export's), with a target_language input where the run has several
    `target_languages` (default: the first). The repetition controls default to the run's
    choice where given (as `translate` searches), else off (as the export's inputs)."""
    sentences = Input("sentences", STRING, 1)
    prefixes, constraints = Input("prefixes", STRING, 1, []), Input("constraints", STRING, 1, [])
    search = [option("beam_size", beam_size), option("alpha", float(alpha))]
    languages = ([Input("target_language", STRING, 1, [target_languages[0]],
                        per_sentence=False)] if target_languages else [])
    repetition = [option("no_repeat_ngram_size", no_repeat_ngram_size),
                  option("repetition_penalty", repetition_penalty)]
    text = {"translations": (STRING, 1), "scores": (FLOAT, 1)}
    table = (
        Signature("serving_default", SEARCH, tuple(
            [sentences, *search, prefixes, constraints, *languages, *repetition]), text),
        Signature("translate_nbest", NBEST, tuple(
            [sentences, *search, Input("num_hypotheses", INT32, 0, beam_size), prefixes,
             constraints, *languages, *repetition]),
            {"translations": (STRING, 2), "scores": (FLOAT, 2)}),
        Signature("sample", SAMPLE, tuple(
            [sentences, *(option(name) for name in ("num_samples", "top_k", "top_p",
                                                    "temperature", "seed")),
             prefixes, *languages]),
            {"translations": (STRING, 2), "scores": (FLOAT, 2)}),
        Signature("score", SCORE, (Input("sources", STRING, 1), Input("targets", STRING, 1),
                                   *languages),
                  {"log_prob": (FLOAT, 1), "tokens": (INT32, 1), "mean": (FLOAT, 1)}),
    )
    return {signature.name: signature for signature in table}


def model_metadata(name, version, table):
    """The answer of GET /v1/models/NAME[/versions/V]/metadata: TensorFlow Serving's shape,
    the SignatureDefs nested twice under "signature_def"."""
    return {"model_spec": {"name": name, "signature_name": "", "version": str(version)},
            "metadata": {"signature_def": {"signature_def": {
                signature.name: signature.metadata() for signature in table.values()}}}}
