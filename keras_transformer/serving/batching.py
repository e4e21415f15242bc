"""Concurrent calls searched together, with TensorFlow Serving's batching knobs and names.

    max_batch_size        the most lines in one batch (a call larger than this is a batch
                          of its own)
    batch_timeout_micros  how long a free batch thread waits for a batch to fill before it
                          searches what it has (0: at once; calls that arrive while the
                          threads are busy fill the next batch anyway)
    num_batch_threads     batches searched at once (default: CTranslate2's workers, so that
                          each worker has a batch)
    max_enqueued_batches  the queue's bound, in batches of max_batch_size lines: a call that
                          would go past it is refused at once, UNAVAILABLE (503) "The batch
                          scheduling queue to which this task was submitted is full", as
                          TensorFlow Serving's (CTranslate2's own queue would block the caller)

Calls wait in arrival order, by batch key (`engines.Engines.batch_key`); a free thread takes
the oldest call's key and that key's calls, oldest first, up to max_batch_size lines. The
engine sorts a batch's lines by length. A call whose client stopped waiting (a deadline) is
dropped when its turn comes.
"""

import asyncio
import collections
import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor

from keras_transformer.serving.errors import UNAVAILABLE, ServingError

QUEUE_FULL = "The batch scheduling queue to which this task was submitted is full"


@dataclasses.dataclass(frozen=True)
class BatchingParameters:
    """TensorFlow Serving's batching parameters (its batching_parameters.txt names)."""

    max_batch_size: int = 32
    batch_timeout_micros: int = 0
    num_batch_threads: int = 2
    max_enqueued_batches: int = 32

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value, low = getattr(self, field.name), 0 if field.name.startswith("batch_") else 1
            if not isinstance(value, int) or value < low:
                raise ValueError(f"{field.name}={value!r} must be an integer of at least {low}.")

    @property
    def queue_lines(self):
        return self.max_batch_size * self.max_enqueued_batches


@dataclasses.dataclass(eq=False)
class _Task:
    key: tuple
    call: object
    lines: int
    future: asyncio.Future
    arrived: float


class Batcher:
    """The queue and the batch threads, in the event loop of the app.

    Args:
        run: run(key, calls) -> one result per call (an exception: that call's error), in
            a batch thread.
        parameters: `BatchingParameters`.
        metrics: `metrics.Metrics` (batch sizes, queue depth) or None.
    """

    def __init__(self, run, parameters=BatchingParameters(), metrics=None):
        self.run, self.parameters, self.metrics = run, parameters, metrics
        self.waiting = collections.OrderedDict()  # key -> deque of tasks, oldest key first
        self.queued = 0  # lines waiting
        self.free = parameters.num_batch_threads
        self.pool = ThreadPoolExecutor(parameters.num_batch_threads, "batch")
        self._timer = None

    async def submit(self, key, call):
        """The result of `call` once its batch is searched; ServingError UNAVAILABLE at once
        when the queue is full."""
        loop = asyncio.get_running_loop()
        lines = max(1, call.lines)
        if self.queued and self.queued + lines > self.parameters.queue_lines:
            raise ServingError(UNAVAILABLE, QUEUE_FULL + f" ({self.queued} lines waiting, "
                               f"at most {self.parameters.queue_lines}: --max-enqueued-batches "
                               "x --max-batch-size).")
        task = _Task(key, call, lines, loop.create_future(), time.monotonic())
        self.waiting.setdefault(key, collections.deque()).append(task)
        self._queued(lines)
        self._dispatch()
        return await task.future

    def _queued(self, change):
        self.queued += change
        if self.metrics is not None:
            self.metrics.queue_depth.set(self.queued)

    def _dispatch(self):
        """Starts batches while a thread is free and calls wait."""
        while self.free and self.waiting:
            key, tasks = next(iter(self.waiting.items()))
            while tasks and tasks[0].future.done():  # its client stopped waiting
                self._queued(-tasks.popleft().lines)
            if not tasks:
                del self.waiting[key]
                continue
            batch, lines = [], 0
            for task in tasks:
                if batch and lines + task.lines > self.parameters.max_batch_size:
                    break
                if not task.future.done():
                    batch.append(task)
                    lines += task.lines
            wait = (self.parameters.batch_timeout_micros / 1e6
                    - (time.monotonic() - tasks[0].arrived))
            if lines < self.parameters.max_batch_size and wait > 0:
                self._wake_in(wait)
                return
            self._start(key, tasks, batch, lines)

    def _start(self, key, tasks, batch, lines):
        taken = set(map(id, batch))
        remaining = collections.deque(t for t in tasks if id(t) not in taken
                                      and not t.future.done())
        dropped = sum(t.lines for t in tasks) - lines - sum(t.lines for t in remaining)
        if remaining:
            self.waiting[key] = remaining
            self.waiting.move_to_end(key)  # the other keys' calls go first now
        else:
            del self.waiting[key]
        self._queued(-lines - dropped)
        self.free -= 1
        if self.metrics is not None:
            self.metrics.batch_lines.observe(lines)
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self.pool, self.run, key, [t.call for t in batch])
        work.add_done_callback(lambda done: self._finished(batch, done))

    def _finished(self, batch, done):
        self.free += 1
        error = done.exception()
        for index, task in enumerate(batch):
            if task.future.done():
                continue
            result = error if error is not None else done.result()[index]
            if isinstance(result, Exception):  # the batch's, or this call's own refusal
                task.future.set_exception(result)
            else:
                task.future.set_result(result)
        self._dispatch()

    def _wake_in(self, seconds):
        if self._timer is None or self._timer.cancelled():
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(seconds, self._woken)

    def _woken(self):
        self._timer = None
        self._dispatch()

    def close(self):
        """Ends the batch threads once their batches are done."""
        self.pool.shutdown(wait=True)
