"""The choice of the repetition controls on dev sentences (tasks/tuning.py: `tune` and the
demo): the rule that prefers the fewest stutters within 0.3 sacreBLEU of the best, the stutter
count it goes by, the choice saved in decoding.json and read back as beam and alpha are (a
given value still wins, a file from before the controls decodes with them off, a constrained
search takes it too). The choice made on a tiny model's val sentences, after alpha:
tests/test_main_job.py's demo job end to end (its own beam searches, not a second set of them
here)."""

import json

import pytest

from keras_transformer.decoding.decoder import Decoder
from keras_transformer.errors import InputError
from keras_transformer.evaluation.stutter import stutter_count, stutters
from keras_transformer.runs import Run
from keras_transformer.tasks.tuning import REPETITION_OFF, pick_repetition, repetition_label


OFF, NGRAM3, NGRAM4, PENALTY = REPETITION_OFF, (3, 1.0), (4, 1.0), (0, 1.2)


def test_a_control_is_kept_for_a_gain_beyond_a_near_tie():
    assert pick_repetition({OFF: (38.42, 12), NGRAM3: (38.80, 0), NGRAM4: (38.53, 7)}) == NGRAM3
    # A gain beyond 0.3 wins even with more stutters than off.
    assert pick_repetition({OFF: (38.42, 0), PENALTY: (38.80, 3)}) == PENALTY
    # Within 0.3, the fewer stutters win over the gain.
    assert pick_repetition({OFF: (38.42, 0), PENALTY: (38.60, 3)}) == OFF


def test_near_ties_go_to_fewer_stutters_then_to_off():
    # The demo's val figures: 4-grams best by 0.10, 3-grams within 0.3 and stutter-free.
    assert pick_repetition({OFF: (38.42, 12), NGRAM3: (38.34, 0), NGRAM4: (38.44, 7)}) == NGRAM3
    assert pick_repetition({OFF: (38.42, 12), NGRAM3: (38.14, 0)}) == NGRAM3
    # Beyond 0.3 below the best, stutter-free does not help.
    assert pick_repetition({OFF: (38.42, 12), NGRAM3: (38.11, 0)}) == OFF
    # The same stutters: off, even 0.25 below.
    assert pick_repetition({NGRAM4: (38.67, 2), OFF: (38.42, 2)}) == OFF
    assert pick_repetition({OFF: (20.0, 0)}) == OFF
    # Equal stutters, none off: the higher BLEU, then the first tried.
    assert pick_repetition({NGRAM3: (38.40, 0), NGRAM4: (38.45, 0), OFF: (38.0, 5)}) == NGRAM4
    assert pick_repetition({NGRAM4: (38.4, 0), NGRAM3: (38.4, 0)}) == NGRAM4


def test_labels_name_the_controls_that_are_on():
    assert repetition_label(OFF) == "off"
    assert repetition_label(NGRAM3) == "no_repeat_ngram_size 3"
    assert repetition_label((3, 1.1)) == "no_repeat_ngram_size 3, repetition_penalty 1.1"


class Pieces:
    """A stand-in vocabulary: one piece per character."""

    @staticmethod
    def encode(texts):
        return [list(text) for text in texts]


def test_an_output_stutters_with_one_piece_four_times_in_a_row():
    assert stutters("abbbb") and stutters([5, 5, 5, 5]) and not stutters("abbbab")
    assert stutters("aab", run=2) and not stutters("")
    with pytest.raises(ValueError, match="run=1 must be at least 2"):
        stutters("aaaa", run=1)
    texts = ["Gestestestest", "Nummer 5555", "Nummer 555", "Neeeeein", ""]
    assert stutter_count(texts, Pieces()) == 2


def test_the_choice_is_saved_and_read_as_beam_and_alpha_are(tmp_path):
    run = Run(tmp_path)
    Decoder.save_choice(run, beam_size=4, alpha=1.4, no_repeat_ngram_size=3,
                        repetition_penalty=1, chosen_by="a test, on val")
    saved = json.loads(run.decoding_path.read_text(encoding="utf-8"))
    assert saved["format_version"] == 2 and saved["repetition_penalty"] == 1.0
    decoder = Decoder.resolve(run)
    request = decoder.request
    assert (request.no_repeat_ngram_size, request.repetition_penalty) == (3, 1.0)
    assert decoder.source("no_repeat_ngram_size") == "run"
    assert "no_repeat_ngram_size 3 [run]" in decoder.describe()
    # A given value (a flag, a Python caller's) wins over the run's.
    given = Decoder.resolve(run, {"no_repeat_ngram_size": 0, "repetition_penalty": 1.2})
    assert (given.request.no_repeat_ngram_size, given.request.repetition_penalty) == (0, 1.2)
    assert given.source("no_repeat_ngram_size") == "given"
    # A saved value out of range is refused naming the file.
    run.decoding_path.write_text('{"format_version": 2, "repetition_penalty": 0}',
                                 encoding="utf-8")
    with pytest.raises(InputError, match=f"{run.decoding_path}: repetition_penalty=0 must be"):
        Decoder.resolve(run)


def test_a_choice_from_before_the_controls_decodes_with_them_off(tmp_path):
    run = Run(tmp_path)
    run.decoding_path.write_text(json.dumps({"format_version": 1, "beam_size": 4, "alpha": 1.4}),
                                 encoding="utf-8")
    request = Decoder.resolve(run).request
    assert (request.alpha, request.no_repeat_ngram_size, request.repetition_penalty) == (
        1.4, 0, 1.0)
    Decoder.save_choice(run, weights="final weights")  # still version 1: older readers read it
    assert json.loads(run.decoding_path.read_text(encoding="utf-8"))["format_version"] == 1


@pytest.mark.slow  # a translate command and two in-process constrained searches
def test_a_constrained_search_takes_the_runs_chosen_controls(run_copy, tmp_path, capsys):
    from keras_transformer import cli
    from tests.conftest import run_engine

    run = Run(run_copy)
    # Alpha 1.8: the tiny model's outputs go on after the phrase, and stutter without the ban.
    Decoder.save_choice(run, beam_size=4, alpha=1.8, no_repeat_ngram_size=1,
                        repetition_penalty=1.0, chosen_by="a test, on val")
    lines = ["the dog runs in the park\tPARK", "a big red cat sleeps\tCAT", "green water\tWATER"]
    source = tmp_path / "constrained.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    output = tmp_path / "out.txt"
    assert cli.main(["translate", "--run-dir", str(run_copy), "--precision", "float32",
                     "--constraints", "--input", str(source), "--output", str(output)]) == 0
    assert "no_repeat_ngram_size 1 [run]" in capsys.readouterr().err
    texts, phrases = [line.split("\t")[0] for line in lines], [[line.split("\t")[1]]
                                                              for line in lines]
    found = output.read_text(encoding="utf-8").splitlines()

    def constrained(ngram):
        engine = run_engine(run_copy, precision="float32", no_repeat_ngram_size=ngram)
        return engine.translate(texts, constraints=phrases)

    assert found == constrained(1) and found != constrained(0)
    assert all(phrase[0] in text for text, phrase in zip(found, phrases))
