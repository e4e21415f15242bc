"""`serve`'s batching queue, request parsing and access rule, without a model: calls of one
key searched together up to max_batch_size lines, a full queue refused at once (503), a
batch timeout waited for, calls whose client left dropped; the row format gathered."""

import asyncio
import threading

import pytest

from keras_transformer.serving.access import Access
from keras_transformer.serving.batching import QUEUE_FULL, Batcher, BatchingParameters
from keras_transformer.serving.errors import ServingError
from keras_transformer.serving.parsing import Call, Limits, parse_body
from keras_transformer.serving.signatures import signatures

TABLE = signatures(beam_size=4, alpha=0.6)


class Lines:
    """A call of `lines` lines (what the batcher reads of a call)."""

    def __init__(self, lines, name=""):
        self.lines, self.name = lines, name


class Recorder:
    """A batch runner that records each batch and waits for `release` before answering."""

    def __init__(self):
        self.batches, self.release = [], threading.Event()

    def __call__(self, key, calls):
        self.batches.append((key, [call.name for call in calls]))
        self.release.wait(10)
        return [f"{key}:{call.name}" for call in calls]


def run(coroutine):
    return asyncio.run(coroutine)


def test_calls_that_arrive_while_the_threads_are_busy_are_searched_together():
    async def scenario():
        recorder = Recorder()
        batcher = Batcher(recorder, BatchingParameters(max_batch_size=6, num_batch_threads=1))
        first = asyncio.ensure_future(batcher.submit("a", Lines(2, "first")))
        await asyncio.sleep(0.05)  # the thread takes it alone
        rest = [asyncio.ensure_future(batcher.submit(key, Lines(2, name)))
                for key, name in (("a", "x"), ("b", "y"), ("a", "z"), ("a", "w"), ("a", "v"))]
        await asyncio.sleep(0.05)
        assert batcher.queued == 10
        recorder.release.set()
        answers = await asyncio.gather(first, *rest)
        batcher.close()
        return recorder.batches, answers

    batches, answers = run(scenario())
    assert answers == ["a:first", "a:x", "b:y", "a:z", "a:w", "a:v"]
    # The oldest call's key first, up to 6 lines; the other key's call next.
    assert batches == [("a", ["first"]), ("a", ["x", "z", "w"]), ("b", ["y"]), ("a", ["v"])]


def test_a_full_queue_answers_at_once():
    async def scenario():
        recorder = Recorder()
        batcher = Batcher(recorder, BatchingParameters(max_batch_size=4, num_batch_threads=1,
                                                       max_enqueued_batches=1))
        busy = asyncio.ensure_future(batcher.submit("a", Lines(4, "busy")))
        await asyncio.sleep(0.05)
        waiting = asyncio.ensure_future(batcher.submit("a", Lines(3, "waiting")))
        await asyncio.sleep(0.01)
        with pytest.raises(ServingError) as refused:
            await asyncio.wait_for(batcher.submit("a", Lines(2, "over")), 1)
        recorder.release.set()
        await asyncio.gather(busy, waiting)
        batcher.close()
        return refused.value

    refused = run(scenario())
    assert refused.status == 503 and refused.message.startswith(QUEUE_FULL)


def test_the_batch_timeout_waits_for_more_and_a_left_call_is_dropped():
    async def scenario():
        recorder = Recorder()
        recorder.release.set()
        batcher = Batcher(recorder, BatchingParameters(max_batch_size=8, num_batch_threads=1,
                                                       batch_timeout_micros=200_000))
        left = asyncio.ensure_future(batcher.submit("a", Lines(1, "left")))
        await asyncio.sleep(0.02)
        left.cancel()  # its client stopped waiting
        calls = [asyncio.ensure_future(batcher.submit("a", Lines(1, name)))
                 for name in ("p", "q")]
        answers = await asyncio.gather(*calls)
        batcher.close()
        return recorder.batches, answers, batcher.queued

    batches, answers, queued = run(scenario())
    assert batches == [("a", ["p", "q"])] and answers == ["a:p", "a:q"] and queued == 0


def test_the_batching_parameters_are_checked():
    with pytest.raises(ValueError, match="max_batch_size=0"):
        BatchingParameters(max_batch_size=0)


def test_rows_are_gathered_and_options_must_agree():
    call = parse_body(b'{"instances": [{"sentences": "a", "prefixes": "X"}, {"sentences": "b",'
                      b' "beam_size": 2}]}', TABLE)
    assert isinstance(call, Call) and call.rows
    assert call.values["sentences"] == ["a", "b"] and call.values["prefixes"] == ["X", ""]
    assert call.values["beam_size"] == 2 and call.values["alpha"] == 0.6
    with pytest.raises(ServingError, match="one value"):
        parse_body(b'{"instances": [{"sentences": "a", "beam_size": 2}, {"sentences": "b",'
                   b' "beam_size": 3}]}', TABLE)
    with pytest.raises(ServingError, match="instance 0 is str"):
        parse_body(b'{"instances": ["a"]}', TABLE)
    with pytest.raises(ServingError) as large:
        parse_body(b'{"inputs": {"sentences": ["a", "b", "c"]}}', TABLE, Limits(max_lines=2))
    assert large.value.status == 413


def test_constraints_need_a_beam_as_the_request_says():
    with pytest.raises(ServingError, match="constraints need beam search"):
        parse_body(b'{"inputs": {"sentences": ["a"], "beam_size": 1, "constraints": ["x"]}}',
                   TABLE)


def test_api_keys_and_the_rate_per_key():
    access = Access(["k1", "k2"], rate=1)
    access.check({"x-api-key": "k1"})
    with pytest.raises(ServingError) as fast:
        access.check({"authorization": "Bearer k1"})
    assert fast.value.status == 429
    access.check({"authorization": "Bearer k2"})  # another key has its own rate
    with pytest.raises(ServingError) as unknown:
        access.check({"authorization": "Bearer nope"})
    assert unknown.value.status == 401
    Access().check({})  # off by default


def test_a_run_of_several_targets_takes_one_language_or_one_per_sentence():
    table = signatures(beam_size=4, alpha=0.6, target_languages=("de", "fr"))
    assert table["score"].input("target_language").default == ["de"]
    assert table["serving_default"].input_names[-3:] == [
        "target_language", "no_repeat_ngram_size", "repetition_penalty"]
    one = parse_body(b'{"inputs": {"sentences": ["a", "b"], "target_language": "fr"}}', table)
    assert one.languages() == ["fr", "fr"]
    rows = parse_body(b'{"instances": [{"sentences": "a", "target_language": "fr"}, '
                      b'{"sentences": "b", "target_language": "de"}]}', table)
    assert rows.languages() == ["fr", "de"]
    assert parse_body(b'{"inputs": {"sentences": ["a"]}}', table).languages() == ["de"]
    with pytest.raises(ServingError, match="one per sentence"):
        parse_body(b'{"inputs": {"sentences": ["a", "b", "c"], "target_language": '
                   b'["de", "fr"]}}', table)
    with pytest.raises(ServingError, match="not in signature"):  # a one-pair run has none
        parse_body(b'{"inputs": {"sentences": ["a"], "target_language": "de"}}', TABLE)
