"""Batches searched at once (`Engine.in_flight`, `engine.in_order`; an engine's own workers
fed by `engine.submitted_in_order`): the results of one search after the other, in input
order; an error ends the map."""

import threading
import time

import pytest

from keras_transformer.decoding.engines.engine import in_order, submitted_in_order
from keras_transformer.decoding.engines.translator import Translator
from keras_transformer.runs import Run


def test_resultsin_order_with_at_most_so_many_calls_at_once():
    running, most = [0], [0]
    lock = threading.Lock()

    def call(number, delay):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(delay)
        with lock:
            running[0] -= 1
        return number

    delays = [0.05, 0.0, 0.03, 0.0, 0.02, 0.01, 0.0]  # later calls often finish first
    arguments = [(number, delay) for number, delay in enumerate(delays)]
    assert list(in_order(call, arguments, 2)) == list(range(len(delays)))
    assert most[0] == 2
    assert list(in_order(call, arguments, 1)) == list(range(len(delays)))


def test_an_error_ends_the_map_and_the_calls_not_started_never_run():
    started = []

    def call(number):
        started.append(number)
        if number == 1:
            raise ValueError("batch 1 is bad")
        time.sleep(0.02)
        return number

    with pytest.raises(ValueError, match="batch 1 is bad"):
        list(in_order(call, [(number,) for number in range(20)], 2))
    assert max(started) <= 3  # at most the two in flight, and the next, once 0 was taken


def test_submitted_calls_are_queued_ahead_and_collected_in_order():
    queued, collected = [], []

    def submit(number):
        queued.append(number)

        def collect():
            # Queued before this one is waited for: this call and up to 3 behind it.
            assert len(queued) == min(number + 4, 10)
            collected.append(number)
            return number * 10

        return collect

    assert list(submitted_in_order(submit, [(n,) for n in range(10)], 3)) == \
        [n * 10 for n in range(10)]
    assert queued == collected == list(range(10))


@pytest.mark.slow  # two translators, two traced searches
def test_a_translator_with_two_batches_in_flight_answers_as_with_one(tiny_run, toy_corpus):
    run = Run(tiny_run)
    sentences = toy_corpus["dev.src"].read_text(encoding="utf-8").splitlines()[:24]
    sentences[5] = ""  # an empty line is answered without a search
    answers = {}
    for in_flight in (1, 2):
        translator = Translator(run.load_model(), run.vocabulary(), beam_size=2,
                                batch_size=4, max_input_length=32, precision="float32")
        translator.in_flight = in_flight
        answers[in_flight] = translator.translate(sentences, nbest=True)
    assert answers[1] == answers[2] and answers[2][5] == [("", 0.0)]
