"""The request is values; the decoder owns where they came from, the run's saved choice (its one
writer), the precision and the line on standard error (decoding/decoder.py)."""

import dataclasses
import json

import pytest

from keras_transformer.decoding.decoder import Decoder
from keras_transformer.decoding.engines.precision import resolve_precision
from keras_transformer.decoding.request import DEFAULTS, PARSE, PARSING, Request
from keras_transformer.errors import InputError
from keras_transformer.runs import Run


def test_a_request_is_checked_frozen_values():
    request = Request(beam_size=5, alpha=1)
    assert (request.beam_size, request.alpha) == (5, 1.0) and isinstance(request.alpha, float)
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.beam_size = 2
    with pytest.raises(InputError, match=r"^beam_size=0 must be at least 1\.$"):
        Request(beam_size=0)
    with pytest.raises(InputError, match=r"^alpha=-1 must be at least 0\.$"):
        request.replace(alpha=-1)
    assert request.replace(alpha=0.6) == Request(beam_size=5, alpha=0.6)
    assert Request.defaults(PARSE) == Request(**PARSING)
    # Translation stops 3 steps ahead; parsing keeps the exact rule (its horizon unmeasured).
    assert (Request().stop_horizon, Request.defaults(PARSE).stop_horizon) == (3, 0)
    with pytest.raises(InputError, match=r"^stop_horizon=-1 must be at least 0 \(0: exact"):
        Request(stop_horizon=-1)


def test_the_saved_choice_is_written_only_checked(tmp_path):
    run = Run(tmp_path)
    saved = Decoder.save_choice(run, beam_size=3, alpha=1, chosen_by="a test, on val")
    assert saved == {"beam_size": 3, "alpha": 1.0, "chosen_by": "a test, on val"}
    assert isinstance(saved["alpha"], float)
    for bad, message in ((dict(beam_size=0), "beam_size=0 must be at least 1"),
                         (dict(beam_size=True), "beam_size=True must be an integer"),
                         (dict(alpha="high"), "alpha='high' must be a number")):
        with pytest.raises(InputError, match=message):
            Decoder.save_choice(run, **bad)
    assert run.decoding() == saved  # nothing written by the refused ones


@pytest.mark.parametrize("content, message", [
    ('{"format_version": 1, "beam_size": 0}', "beam_size=0 must be at least 1"),
    ('{"format_version": 1, "beam_size": "four"}', "beam_size='four' must be an integer"),
])
def test_a_saved_value_out_of_its_declaration_is_refused_naming_the_file(tmp_path, content,
                                                                          message):
    run = Run(tmp_path)
    run.decoding_path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError, match=f"^{run.decoding_path}: {message}"):
        Decoder.resolve(run)


def test_values_come_from_what_was_given_then_the_run_then_the_defaults(tmp_path):
    run = Run(tmp_path)
    run.decoding_path.write_text(json.dumps({"format_version": 1, "beam_size": 6, "alpha": 1.2,
                                             "chosen_by": "a test"}), encoding="utf-8")
    decoder = Decoder.resolve(run, {"alpha": 0.8})
    assert (decoder.request.beam_size, decoder.request.alpha) == (6, 0.8)
    assert (decoder.source("beam_size"), decoder.source("alpha"),
            decoder.source("batch_size")) == ("run", "given", "default")
    assert decoder.chosen_by == "a test"
    # Parsing has its own search: the run's translation choice does not apply to it.
    parsing = Decoder.resolve(run, command=PARSE)
    assert parsing.request == Request(**PARSING) and parsing.sources == {}
    assert parsing.describe().startswith("parsing with model.keras: beam_size 21, alpha 0.3,")


def test_describe_says_the_precision_before_an_engine_is_built():
    decoder = Decoder(Request(beam_size=2))
    precision, reason = resolve_precision()
    assert decoder.precision == (precision, reason)
    assert decoder.describe() == (
        f"decoding with the members' models: beam_size 2, alpha {DEFAULTS['alpha']}, "
        f"stop_horizon {DEFAULTS['stop_horizon']}, precision "
        f"{precision}, batch_size {DEFAULTS['batch_size']}, {said_xla(precision)}, "
        f"engine tensorflow; "
        f"{reason}")
    assert Decoder(Request(engine="ctranslate2")).precision == (None, None)


def said_xla(precision):
    """What the decoder's line says of XLA under auto (`decoding.engines.xla`)."""
    from keras_transformer.decoding.engines.xla import resolve_xla

    on, why = resolve_xla(None, precision)
    return f"xla {'on' if on else 'off'} [{why}]"
