"""AsyncLLM: the engine behind a server. One loop owns the ``LLMEngine`` and steps it while it has requests;
asyncio callers get each request's outputs as an async iterator.

    llm = AsyncLLM(engine, max_waiting=256)                 # the engine loop in a thread of this process
    llm = AsyncLLM(EngineProcess(model, llm_kwargs))        # ... or in a process of its own
    await llm.start()                                       # from the event loop that will call generate
    async for out in llm.generate(prompt_ids, SamplingParams(max_tokens=32)):
        ...out.new_token_ids, out.text, out.finished        # cumulative RequestOutputs
    await llm.shutdown()                                    # drains: waits for every stream, then stops the loop

Why the engine loop is not an asyncio task: a step is blocking torch work (milliseconds on a GPU, far more on a
CPU); as a task it would stall the event loop, and with it every client's socket, for the length of each step.
``EngineLoop`` runs steps back to back; callers hand it commands (add, abort) through a queue it drains between
steps, so requests from many clients join the same batches and the engine needs no lock. It posts each step's
outputs in one batch; the event loop routes them to per-request asyncio queues, and a stream whose consumer fell
behind yields one merged output for the outputs it missed.
  * ``ThreadEngine`` (what ``AsyncLLM(engine)`` builds; ``serve``'s default on the CPU): the loop in a thread of
    this process, posting through ``call_soon_threadsafe``.
    Torch releases the GIL in its kernels and while the host waits for the device, but the Python of the engine
    and of the event loop (per stream chunk: the queue hand-off, SSE rendering, the socket write) share it.
  * ``EngineProcess`` (``serve``'s default on CUDA): the loop in a spawned process that builds the ``LLM`` itself
    (vLLM's engine-core split), with commands in and outputs out over pipes, as deltas (new tokens, new text, new
    logprobs; the prompt's logprobs with the first) rebuilt into cumulative outputs here. The engine's host work
    then never waits for the event loop's.

Faults: a request whose stream is closed before it finished (a client that disconnects: the server's iterator is
cancelled or closed) is aborted, which frees its KV blocks, state slot and snapshot references. A step that raises
fails the requests the engine aborted for it (``LLMEngine.step``: those it touched) with ``RequestFailedError``; the
others, and new ones, are served on. An engine process that dies fails every open request. More than
``max_waiting`` requests queued (waiting in the scheduler or not yet handed to the engine) raises
``QueueFullError``, as does any new request once ``shutdown`` began.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import multiprocessing
import queue
import signal
import threading
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from compiled_engine.engine import LLMEngine, validate_request
from compiled_engine.llm import load_tokenizer
from compiled_engine.outputs import RequestOutput, TokenLogprobs
from compiled_engine.sampler import bad_word_ids
from compiled_engine.sampling_params import RequestOutputKind, SamplingParams
from compiled_engine.structured_output import GrammarCache
from compiled_engine.tiny_model import ensure_tiny_model

logger = logging.getLogger(__name__)


class QueueFullError(RuntimeError):
    """More requests are waiting than ``max_waiting`` allows, or the server is shutting down."""


class RequestFailedError(RuntimeError):
    """The engine step that was computing the request raised (or the engine process died); the request was
    aborted."""


@dataclass(frozen=True)
class EngineStats:
    """The engine's state after its last step (published by the engine loop; read by /metrics)."""

    num_running: int = 0
    num_waiting: int = 0  # in the scheduler's waiting queue (preempted ones included)
    num_kv_blocks: int = 0  # usable ones (less the null block)
    num_free_kv_blocks: int = 0  # free or evictable (cached, held by nobody)
    num_state_slots: int = 0  # usable ones (less the null slot)
    num_free_state_slots: int = 0
    num_snapshots: int = 0  # prefix-cache snapshot rows holding a state
    num_failed_steps: int = 0
    num_added: int = 0  # add commands applied (accepted or refused), ever


Posted = list[tuple[str, "RequestOutput | BaseException | None"]]  # None: the request was aborted (forget it)


# --------------------------------------------------------------------------------------------------------------
# The engine loop
# --------------------------------------------------------------------------------------------------------------


def checked_stream_interval(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"stream_interval must be an int >= 1, got {value!r}")
    return value


class EngineLoop:
    def __init__(self, engine: LLMEngine, post: Callable[[Posted], None], stream_interval: int = 1):
        """``post(items)``: called on the loop's thread after each step and each batch of commands, with ``stats``
        already updated. ``stream_interval``: after a request's first token, post its outputs every that many
        tokens (and when it finishes): fewer, larger stream chunks for less per-token work downstream (SGLang's
        ``--stream-interval``); 1 posts every step's."""
        self.engine = engine
        self.stream_interval = checked_stream_interval(stream_interval)
        self._post = post
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._stopping = False
        # The ids added and not finished, aborted or failed, each with the new tokens held back since its last
        # posted output (stream_interval), or None before its first one.
        self._live: dict[str, list[int] | None] = {}
        self._failed_steps = 0
        self._added = 0
        self.stats = EngineStats()
        self._publish_stats()

    def submit(self, command: tuple) -> None:
        """``("add", request_id, token_ids, params)`` (checked already) or ``("abort", request_id)``; any thread."""
        self._commands.put(command)
        self._wakeup.set()

    def stop(self) -> None:
        """Make ``run`` return once no request is left."""
        self._stopping = True
        self._wakeup.set()

    def run(self) -> None:
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

    def _to_post(self, outputs: list[RequestOutput]) -> Posted:
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

    def _apply_commands(self) -> Posted:
        """Add and abort what callers asked for; the requests the engine refused, with their error, and the
        aborted ones (None)."""
        posted = []
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return posted
            request_id = command[1]
            if command[0] == "add":
                self._added += 1
                try:
                    self.engine.add_request(request_id, command[2], command[3])
                except ValueError as error:
                    posted.append((request_id, error))
                else:
                    self._live[request_id] = None
            else:
                self._live.pop(request_id, None)
                if request_id in self.engine.requests:
                    self.engine.abort_request(request_id)
                posted.append((request_id, None))

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
            num_added=self._added,
        )


# --------------------------------------------------------------------------------------------------------------
# Where the engine loop runs
# --------------------------------------------------------------------------------------------------------------

Deliver = Callable[[Posted], None]  # on the event loop


class ThreadEngine:
    """The engine loop in a thread of this process, over ``engine``."""

    def __init__(self, engine: LLMEngine, stream_interval: int = 1):
        self.engine = engine
        self._loop = EngineLoop(engine, self._post, stream_interval)
        self._thread: threading.Thread | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._deliver: Deliver | None = None

    @property
    def stats(self) -> EngineStats:
        return self._loop.stats

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def max_model_len(self) -> int:
        return self.engine.runtime.max_model_len

    def validate_request(self, prompt_token_ids, params):
        return self.engine.validate_request(prompt_token_ids, params)

    async def start(self, deliver: Deliver) -> None:
        self._event_loop, self._deliver = asyncio.get_running_loop(), deliver
        self._thread = threading.Thread(target=self._loop.run, name="engine", daemon=True)
        self._thread.start()

    def submit(self, command: tuple) -> None:
        self._loop.submit(command)

    async def stop(self) -> None:
        self._loop.stop()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    def _post(self, items: Posted) -> None:
        if items:
            try:
                self._event_loop.call_soon_threadsafe(self._deliver, items)
            except RuntimeError:  # the event loop is closed: nobody is listening any more
                pass


@dataclass
class _Remote:
    """A request of the engine process, as rebuilt here from its deltas."""

    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str | None = None
    logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None


class EngineProcess:
    """The engine loop in a spawned process that builds ``LLM(model, **llm_kwargs)`` (so that its host work never
    waits for this process's GIL); commands go over one pipe, outputs come back over another as deltas."""

    def __init__(self, model: str | None, llm_kwargs: dict, stream_interval: int = 1, start_timeout_s: float = 3600):
        self.model, self.llm_kwargs = model, dict(llm_kwargs)
        self.stream_interval = checked_stream_interval(stream_interval)
        self.start_timeout_s = start_timeout_s
        self.stats = EngineStats()
        self.info: dict | None = None  # max_model_len, vocab_size, has_tokenizer: sent by the process once ready
        self._requests: dict[str, _Remote] = {}
        self._process = self._commands = self._outputs = None
        self._deliver: Deliver | None = None
        self._dead = False
        self._grammars: GrammarCache | None = None  # structured outputs' specs checked here too (built on first use)
        self._loaded_tokenizer = None  # the model's, for validate_request's checks (loaded on first use)

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.is_alive() and not self._dead

    @property
    def max_model_len(self) -> int:
        return self.info["max_model_len"]

    def validate_request(self, prompt_token_ids, params):
        info = self.info
        token_ids, params = validate_request(prompt_token_ids, params, max_model_len=info["max_model_len"],
                                             vocab_size=info["vocab_size"], has_tokenizer=info["has_tokenizer"])
        # What the engine checks with its tokenizer is a bad request here too: a spec xgrammar refuses, a bad word
        # with a token past the model's vocabulary.
        if params.structured_outputs is not None:
            if self._grammars is None:
                self._grammars = GrammarCache(self._tokenizer(), info["vocab_size"])
            self._grammars.compile(params.structured_outputs)
        if params.bad_words is not None:
            bad_word_ids(self._tokenizer(), params.bad_words, info["vocab_size"])
        return token_ids, params

    def _tokenizer(self):
        if self._loaded_tokenizer is None:
            self._loaded_tokenizer = load_tokenizer(self.model if self.model is not None else ensure_tiny_model())
        return self._loaded_tokenizer

    async def start(self, deliver: Deliver) -> None:
        self._deliver = deliver
        context = multiprocessing.get_context("spawn")
        commands_in, self._commands = context.Pipe(duplex=False)
        self._outputs, outputs_out = context.Pipe(duplex=False)
        self._process = context.Process(target=_engine_process_main, name="engine",
                                        args=(commands_in, outputs_out, self.model, self.llm_kwargs,
                                              self.stream_interval))
        self._process.start()
        commands_in.close()
        outputs_out.close()
        ready = await asyncio.to_thread(self._wait_ready)
        if ready[0] != "ready":
            await asyncio.to_thread(self._process.join)
            raise RuntimeError(f"the engine process failed to start: {ready[1]}")
        self.info = ready[1]
        asyncio.get_running_loop().add_reader(self._outputs.fileno(), self._readable)

    def _wait_ready(self) -> tuple:
        if not self._outputs.poll(self.start_timeout_s):
            self._process.kill()
            return ("error", f"no answer within {self.start_timeout_s} s")
        try:
            return self._outputs.recv()
        except EOFError:
            return ("error", f"it exited with code {self._process.exitcode}")

    def submit(self, command: tuple) -> None:
        if command[0] == "add":
            self._requests[command[1]] = _Remote(command[2])
        else:
            self._requests.pop(command[1], None)
        if self._dead:
            self._fail_all()
            return
        try:
            self._commands.send(command)
        except OSError:  # the process is gone: _readable fails its requests
            pass

    async def stop(self) -> None:
        if self._process is None:
            return
        if not self._dead:
            try:
                self._commands.send(("stop",))
            except OSError:
                pass
        await asyncio.to_thread(self._process.join)
        if not self._dead:
            asyncio.get_running_loop().remove_reader(self._outputs.fileno())
            self._dead = True

    def _readable(self) -> None:
        """On the event loop: every message waiting on the output pipe, rebuilt into cumulative outputs."""
        try:
            while self._outputs.poll():
                items, self.stats = self._outputs.recv()
                self._deliver([self._rebuild(request_id, item) for request_id, item in items])
        except (EOFError, OSError):
            self._died()

    def _rebuild(self, request_id: str, item) -> tuple:
        if not isinstance(item, tuple):  # an error (or None: aborted)
            self._requests.pop(request_id, None)
            return request_id, item
        new_tokens, new_text, new_logprobs, prompt_logprobs, finished, reason, stop_reason, cached = item
        remote = self._requests.get(request_id)
        if remote is None:  # its stream closed meanwhile
            return request_id, None
        remote.token_ids += new_tokens
        if new_text is not None:
            remote.text = (remote.text or "") + new_text
        if new_logprobs is not None:
            remote.logprobs = (remote.logprobs or []) + [TokenLogprobs(t, v, top) for t, v, top in new_logprobs]
        if prompt_logprobs is not None:
            remote.prompt_logprobs = [None] + [TokenLogprobs(t, v, top) for t, v, top in prompt_logprobs]
        if finished:
            del self._requests[request_id]
        out = RequestOutput(request_id, remote.prompt_token_ids, list(remote.token_ids), new_tokens, finished,
                            reason, remote.text, stop_reason, remote.logprobs and list(remote.logprobs),
                            prompt_logprobs=remote.prompt_logprobs, num_cached_tokens=cached)
        return request_id, out

    def _died(self) -> None:
        if self._dead:
            return
        self._dead = True
        asyncio.get_running_loop().remove_reader(self._outputs.fileno())
        self._fail_all()

    def _fail_all(self) -> None:
        """Fail every request still open here (the process is gone), from the event loop's next turn."""
        failure = RequestFailedError(f"the engine process exited (code {self._process.exitcode})")
        failed, self._requests = list(self._requests), {}
        if failed:
            asyncio.get_running_loop().call_soon(self._deliver, [(request_id, failure) for request_id in failed])


def _engine_process_main(commands, outputs, model, llm_kwargs: dict, stream_interval: int) -> None:
    """The engine process: build the LLM, then run the engine loop, reading commands on a thread of its own."""
    from compiled_engine.llm import LLM

    # The server decides when to stop (it drains first): Ctrl-C on the terminal or SIGTERM to the group is its.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        llm = LLM(model, **llm_kwargs)
    except BaseException as error:  # noqa: B036 (reported to the server, which raises it)
        outputs.send(("error", f"{type(error).__name__}: {error}"))
        return
    runtime = llm.runtime
    outputs.send(("ready", {"max_model_len": runtime.max_model_len, "vocab_size": runtime.model_config.vocab_size,
                            "has_tokenizer": llm.tokenizer is not None}))
    sent: dict[str, tuple[int, int]] = {}  # request id -> (characters, logprobs) already sent

    def delta(request_id: str, item):
        """An output as what is new since the last one sent (errors and aborts as they are); the prompt's logprobs
        with the first."""
        if not isinstance(item, RequestOutput):
            sent.pop(request_id, None)
            return item
        first = request_id not in sent
        chars, entries = sent.pop(request_id, (0, 0))
        text = None if item.text is None else item.text[chars:]
        logprobs = None
        if item.logprobs is not None:
            logprobs = [(e.token_id, e.logprob, e.top) for e in item.logprobs[entries:]]
        if not item.finished:
            sent[request_id] = (len(item.text or ""), len(item.logprobs or ()))
        prompt_logprobs = None
        if first and item.prompt_logprobs is not None:
            prompt_logprobs = [(e.token_id, e.logprob, e.top) for e in item.prompt_logprobs[1:]]
        return (item.new_token_ids, text, logprobs, prompt_logprobs, item.finished, item.finish_reason,
                item.stop_reason, item.num_cached_tokens)

    def post(items: Posted) -> None:
        try:
            outputs.send(([(r, delta(r, item)) for r, item in items], loop.stats))
        except OSError:  # the server is gone: nobody to serve
            raise SystemExit(0) from None

    loop = EngineLoop(llm.engine, post, stream_interval)

    def read_commands() -> None:
        while True:
            try:
                command = commands.recv()
            except (EOFError, OSError):  # the server is gone
                command = ("stop",)
            if command[0] == "stop":
                loop.stop()
                return
            loop.submit(command)

    threading.Thread(target=read_commands, name="commands", daemon=True).start()
    try:
        loop.run()
    finally:
        llm.close()


# --------------------------------------------------------------------------------------------------------------
# The asyncio side
# --------------------------------------------------------------------------------------------------------------


class AsyncLLM:
    def __init__(self, engine: LLMEngine | ThreadEngine | EngineProcess, *, max_waiting: int | None = None,
                 stream_interval: int = 1):
        """``engine``: an ``LLMEngine`` (run by a ``ThreadEngine`` with ``stream_interval``; every request it gets
        must come through ``generate``) or an engine loop's host (``ThreadEngine``, ``EngineProcess``).
        ``max_waiting``: the most requests waiting for admission (None: no limit)."""
        self.host = ThreadEngine(engine, stream_interval) if isinstance(engine, LLMEngine) else engine
        self.max_waiting = max_waiting
        self._streams: dict[str, asyncio.Queue] = {}  # the live requests' output queues
        self._idle = asyncio.Event()  # no stream open (set when _streams empties)
        self._idle.set()
        self._num_submitted = 0  # add commands handed to the engine loop, ever
        self._ids = itertools.count()
        self._accepting = True
        self._started = False

    @property
    def engine(self) -> LLMEngine | None:
        """The engine, where it lives in this process (a ThreadEngine's)."""
        return getattr(self.host, "engine", None)

    @property
    def stats(self) -> EngineStats:
        return self.host.stats

    @property
    def alive(self) -> bool:
        """Whether the engine loop runs (a dead engine process fails every request)."""
        return self.host.alive

    @property
    def max_model_len(self) -> int:
        """The engine's (known once started, for an engine process)."""
        return self.host.max_model_len

    async def start(self) -> None:
        """Start the engine loop; outputs will be delivered to the running event loop."""
        await self.host.start(self._deliver)
        self._started = True

    @property
    def num_waiting(self) -> int:
        """Requests waiting for admission: in the scheduler's queue, or not yet handed to the engine."""
        stats = self.stats
        return stats.num_waiting + self._num_submitted - stats.num_added

    def check_capacity(self, num_requests: int = 1) -> None:
        """Raise QueueFullError unless ``num_requests`` more may queue now."""
        if not self._accepting:
            raise QueueFullError("the server is shutting down")
        if self.max_waiting is not None and self.num_waiting + num_requests > self.max_waiting:
            raise QueueFullError(f"{self.num_waiting} requests are waiting (max_waiting={self.max_waiting})")

    def validate_request(self, prompt_token_ids: list[int], params: SamplingParams | None):
        """The engine's checks of a request (``LLMEngine.validate_request``): the checked prompt and params, or
        ValueError naming the bad field."""
        return self.host.validate_request(prompt_token_ids, params)

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """The request's outputs as the engine produces them (cumulative; the last one has ``finished``).

        Raises ValueError for a bad prompt or params (nothing queued), QueueFullError (see ``check_capacity``), and
        RequestFailedError from the iteration when a step computing it raised. Closing the iterator early aborts
        the request."""
        if not self._started:
            raise RuntimeError("AsyncLLM.start() has not been called")
        if not self.alive:
            raise RequestFailedError("the engine loop is not running")
        token_ids, params = self.validate_request(prompt_token_ids, params)
        if params.output_kind is RequestOutputKind.FINAL_ONLY:
            params = dataclasses.replace(params, output_kind=RequestOutputKind.CUMULATIVE)
        self.check_capacity()
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._streams:
            raise ValueError(f"request id {request_id!r} is already in use")
        outputs: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = outputs
        self._idle.clear()
        self._num_submitted += 1
        self.host.submit(("add", request_id, token_ids, params))
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
                self.host.submit(("abort", request_id))

    async def shutdown(self) -> None:
        """Refuse new requests, wait for the open streams to finish, then stop the engine loop."""
        self._accepting = False
        await self._idle.wait()
        await self.host.stop()

    def _deliver(self, items: Posted) -> None:
        """On the event loop: route the engine loop's outputs and failures to their streams (a stream closed
        meanwhile, e.g. by a disconnect, gets nothing)."""
        for request_id, item in items:
            outputs = self._streams.get(request_id)
            if outputs is not None and item is not None:
                outputs.put_nowait(item)
