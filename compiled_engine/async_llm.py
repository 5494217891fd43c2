"""AsyncLLM: the engine behind a server. One thread owns the ``LLMEngine`` and steps it while it has requests;
asyncio callers get each request's outputs as an async iterator.

    llm = AsyncLLM(engine, max_waiting=256)
    await llm.start()                                       # from the event loop that will call generate
    async for out in llm.generate(prompt_ids, SamplingParams(max_tokens=32)):
        ...out.new_token_ids, out.text, out.finished        # cumulative RequestOutputs (engine.step's)
    await llm.shutdown()                                    # drains: waits for every stream, then stops the thread

Why a thread, not an asyncio task: a step is blocking torch work (milliseconds on a GPU, far more on a CPU). Run as a
task it would stall the event loop, and with it every client's socket, for the length of each step. The engine
thread runs steps back to back; torch releases the GIL inside its kernels, so the event loop serves HTTP meanwhile.
All engine calls happen on that thread: callers hand it commands (add, abort) through a queue it drains between
steps, so requests from many clients join the same batches and the engine needs no lock. After each step it posts
the step's outputs to the event loop in one ``call_soon_threadsafe``, which routes them to per-request asyncio
queues; a stream whose consumer fell behind yields one merged output for the outputs it missed.

Faults: a request whose stream is closed before it finished (a client that disconnects: the server's iterator is
cancelled or closed) is aborted, which frees its KV blocks, state slot and snapshot references. A step that raises
fails the requests the engine aborted for it (``LLMEngine.step``: those it touched) with ``RequestFailedError``; the
others, and new ones, are served on. More than ``max_waiting`` requests queued (waiting in the scheduler or not yet
handed to the engine) raises ``QueueFullError``, as does any new request once ``shutdown`` began.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import queue
import threading
from dataclasses import dataclass
from typing import AsyncIterator

from compiled_engine.engine import LLMEngine, RequestOutput
from compiled_engine.sampling_params import RequestOutputKind, SamplingParams

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """More requests are waiting than ``max_waiting`` allows, or the server is shutting down."""


class RequestFailedError(RuntimeError):
    """The engine step that was computing the request raised; the request was aborted."""


@dataclass(frozen=True)
class EngineStats:
    """The engine's state after its last step (published by the engine thread; read by /metrics)."""

    num_running: int = 0
    num_waiting: int = 0  # in the scheduler's waiting queue (preempted ones included)
    num_kv_blocks: int = 0  # usable ones (less the null block)
    num_free_kv_blocks: int = 0  # free or evictable (cached, held by nobody)
    num_state_slots: int = 0  # usable ones (less the null slot)
    num_free_state_slots: int = 0
    num_snapshots: int = 0  # prefix-cache snapshot rows holding a state
    num_failed_steps: int = 0


class AsyncLLM:
    def __init__(self, engine: LLMEngine, *, max_waiting: int | None = None, stream_interval: int = 1):
        """``engine``: used by the engine thread only, from ``start`` to ``shutdown``; every request it gets must come
        through ``generate``. ``max_waiting``: the most requests waiting for admission (None: no limit).
        ``stream_interval``: after a request's first token, post its outputs every that many tokens (and when it
        finishes): fewer, larger stream chunks for less per-token work on the event loop (SGLang's
        ``--stream-interval``); 1 posts every step's."""
        if isinstance(stream_interval, bool) or not isinstance(stream_interval, int) or stream_interval < 1:
            raise ValueError(f"stream_interval must be an int >= 1, got {stream_interval!r}")
        self.engine = engine
        self.max_waiting = max_waiting
        self.stream_interval = stream_interval
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._streams: dict[str, asyncio.Queue] = {}  # event-loop side: the live requests' output queues
        self._idle = asyncio.Event()  # no stream open (set when _streams empties)
        self._idle.set()
        self._lock = threading.Lock()
        self._num_unsubmitted = 0  # requests handed to the thread, not yet added to the engine (under _lock)
        # Engine-thread side: the ids added and not finished, aborted or failed, each with the new tokens held back
        # since its last posted output (stream_interval), or None before its first one.
        self._live: dict[str, list[int] | None] = {}
        self._ids = itertools.count()
        self._accepting = True
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.stats = EngineStats()
        self._failed_steps = 0

    # ----------------------------------------------------------------------------------------- event-loop side
    async def start(self) -> None:
        """Start the engine thread; outputs will be delivered to the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._publish_stats()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    @property
    def num_waiting(self) -> int:
        """Requests waiting for admission: in the scheduler's queue, or not yet handed to the engine."""
        return self.stats.num_waiting + self._num_unsubmitted

    def check_capacity(self, num_requests: int = 1) -> None:
        """Raise QueueFullError unless ``num_requests`` more may queue now."""
        if not self._accepting:
            raise QueueFullError("the server is shutting down")
        if self.max_waiting is not None and self.num_waiting + num_requests > self.max_waiting:
            raise QueueFullError(f"{self.num_waiting} requests are waiting (max_waiting={self.max_waiting})")

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """The request's outputs as the engine produces them (cumulative; the last one has ``finished``).

        Raises ValueError for a bad prompt or params (nothing queued), QueueFullError (see ``check_capacity``), and
        RequestFailedError from the iteration when a step computing it raised. Closing the iterator early aborts
        the request."""
        if self._thread is None:
            raise RuntimeError("AsyncLLM.start() has not been called")
        token_ids, params = self.engine.validate_request(prompt_token_ids, params)
        if params.output_kind is RequestOutputKind.FINAL_ONLY:
            params = dataclasses.replace(params, output_kind=RequestOutputKind.CUMULATIVE)
        self.check_capacity()
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        outputs: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = outputs
        self._idle.clear()
        with self._lock:
            self._num_unsubmitted += 1
        self._submit(("add", request_id, token_ids, params))
        finished = False
        failure = None
        try:
            while True:
                item = failure or await outputs.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                # A consumer that fell behind gets one output for all the steps it missed (the latest, whose
                # new_token_ids are all of theirs): its per-output work then does not grow with the backlog.
                while not outputs.empty():
                    later = outputs.get_nowait()
                    if isinstance(later, BaseException):
                        failure = later
                        break
                    later.new_token_ids = item.new_token_ids + later.new_token_ids  # the stream's own object
                    item = later
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            del self._streams[request_id]
            if not self._streams:
                self._idle.set()
            if not finished:
                self._submit(("abort", request_id))

    async def shutdown(self) -> None:
        """Refuse new requests, wait for the open streams to finish, then stop the engine thread."""
        self._accepting = False
        await self._idle.wait()
        self._stopping = True
        self._wakeup.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    def _submit(self, command: tuple) -> None:
        self._commands.put(command)
        self._wakeup.set()

    def _deliver(self, items: list[tuple[str, RequestOutput | BaseException]]) -> None:
        """On the event loop: route the engine thread's outputs and failures to their streams (a stream closed
        meanwhile, e.g. by a disconnect, gets nothing)."""
        for request_id, item in items:
            outputs = self._streams.get(request_id)
            if outputs is not None:
                outputs.put_nowait(item)

    # ------------------------------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        engine = self.engine
        while True:
            posted = self._apply_commands()
            if not engine.has_unfinished_requests():
                self._publish_stats()
                self._post(posted)
                if self._stopping:
                    return
                self._wakeup.wait()
                self._wakeup.clear()
                continue
            try:
                outputs = engine.step()
            except Exception as error:  # the engine aborted the requests the step touched: fail exactly those
                self._failed_steps += 1
                logger.exception("engine step failed")
                failed = [r for r in self._live if r not in engine.requests]
                for request_id in failed:
                    del self._live[request_id]
                failure = RequestFailedError(f"the engine step failed: {type(error).__name__}: {error}")
                posted += [(r, failure) for r in failed]
            else:
                posted += self._to_post(outputs)
            self._publish_stats()
            self._post(posted)

    def _to_post(self, outputs: list[RequestOutput]) -> list[tuple[str, RequestOutput]]:
        """The step's outputs to post: a request's first and last, and one each ``stream_interval`` new tokens,
        carrying the new tokens of the outputs held back before it (the rest are cumulative already)."""
        posted = []
        for out in outputs:
            request_id = out.request_id
            held = self._live.get(request_id)
            if out.finished:
                self._live.pop(request_id, None)
            elif held is not None and len(held) + len(out.new_token_ids) < self.stream_interval:
                held.extend(out.new_token_ids)
                continue
            else:
                self._live[request_id] = []
            if held:
                out.new_token_ids = held + out.new_token_ids
            posted.append((request_id, out))
        return posted

    def _apply_commands(self) -> list[tuple[str, BaseException]]:
        """Add and abort what the event loop asked for; the requests the engine refused, with their error."""
        refused = []
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return refused
            if command[0] == "add":
                _, request_id, token_ids, params = command
                with self._lock:
                    self._num_unsubmitted -= 1
                try:
                    self.engine.add_request(request_id, token_ids, params)
                except ValueError as error:
                    refused.append((request_id, error))
                else:
                    self._live[request_id] = None
            else:
                request_id = command[1]
                self._live.pop(request_id, None)
                if request_id in self.engine.requests:
                    self.engine.abort_request(request_id)

    def _post(self, items: list) -> None:
        if items:
            try:
                self._loop.call_soon_threadsafe(self._deliver, items)
            except RuntimeError:  # the event loop is closed: nobody is listening any more
                pass

    def _publish_stats(self) -> None:
        engine = self.engine
        caches = engine.runtime.caches
        prefix = caches.prefix_cache
        self.stats = EngineStats(
            num_running=len(engine.scheduler.running),
            num_waiting=len(engine.scheduler.waiting),
            num_kv_blocks=caches.blocks.num_blocks - 1,
            num_free_kv_blocks=caches.num_free_blocks,
            num_state_slots=caches.slots.num_slots - 1,
            num_free_state_slots=caches.num_free_slots,
            num_snapshots=prefix.num_snapshots if prefix is not None else 0,
            num_failed_steps=self._failed_steps,
        )
