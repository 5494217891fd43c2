"""Tensor-parallel worker processes, driven in lockstep by the caller's Runtime (rank 0).

The caller's process is rank 0: it owns the scheduler and all bookkeeping (blocks, slots, sequences) and holds shard 0
of the model. Ranks 1..N-1 are processes this module spawns; each loads only its own shard, allocates its caches
(compiled_engine.memory_plan) and serves commands with its own ModelExecutor. Every command is a broadcast from rank 0
over the process group itself (NCCL on GPUs, gloo on CPU): a small int64 header, then the step's tensors. All ranks then
run the same model code, whose all-reduces / all-gathers meet inside the forward.

Failure handling: each worker reports "started"/"joined"/"loaded"/"ready" or its traceback through a
multiprocessing queue. The driver waits for those reports in Python (polling the queue and that the processes are
alive) before it enters any collective, so a worker that fails to start, or dies before it even runs (a spawned
process re-imports the caller's main module: a script read from standard input, or one without
``if __name__ == "__main__":``, breaks that), surfaces as a WorkerError in the caller instead of a hang, and Ctrl-C
interrupts the wait. The rendezvous is split the same way: rank 0 hosts the TCPStore without waiting in its
constructor, each worker reports "joined" once its client is connected, and rank 0 waits for that in Python; only
then do the ranks enter ``init_process_group``, whose C++ wait (for the peers' backend addresses) is bounded by
RENDEZVOUS_TIMEOUT, after which the group's timeout becomes COLLECTIVE_TIMEOUT. A worker that dies in that last
window is seen when the rendezvous times out. A worker that fails later reports its traceback and exits; the
driver's next collective then fails and the driver raises that traceback (or the dead worker's exit code). With
NCCL a dead rank would leave the driver's collectives waiting for the collective timeout, so a watch thread aborts
the driver's communicators as soon as a worker process ends unasked (``abort_collectives_when_a_worker_dies``).

Teardown: ``shutdown`` tells the workers to stop with a broadcast only when the ranks are known to be in lockstep,
i.e. no exception is propagating (a KeyboardInterrupt in the middle of a step leaves the workers inside a
collective, where a stop broadcast would not meet them: they would wait for COLLECTIVE_TIMEOUT). Otherwise it
kills them (``abort``). Either way it leaves the default process group, so a later TP runtime can create its own.
It runs from ``close()``, when the Runtime is garbage-collected (weakref.finalize) and at interpreter exit (atexit).
"""

from __future__ import annotations

import atexit
import gc
import os
import queue
import sys
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait as wait_for_any
from typing import NoReturn

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from compiled_engine.distributed import TensorParallel
from compiled_engine.executor import ModelExecutor
from compiled_engine.loader import load_model
from compiled_engine.memory_plan import allocate_caches
from compiled_engine.prefix_cache import SAVE, PrefixCache
from compiled_engine.step import upload
from ops.step import StepInputs

CMD_STOP, CMD_STEP, CMD_RESET_SLOT, CMD_COMPILE, CMD_SNAPSHOT_SAVE, CMD_SNAPSHOT_RESTORE = 0, 1, 2, 3, 4, 5
# Speculative decoding: ModelExecutor's draft, accept, fused_round, compile_rounds and run_round.
CMD_DRAFT, CMD_ACCEPT, CMD_ROUND, CMD_COMPILE_ROUNDS, CMD_ROUND_BUFFERS = 6, 7, 8, 9, 10
HEADER_SIZE = 9
STARTUP_TIMEOUT_S = 600  # loading a large shard can take minutes
JOIN_TIMEOUT_S = 50  # from the spawn: a worker joins after importing torch and this package (seconds);
# with the 0.5 s polling, a worker that hangs before joining is reported within a minute
COLLECTIVE_TIMEOUT = timedelta(minutes=10)
# init_process_group's own wait, entered once every worker is connected to the store: the ranks exchange their
# backend's addresses, which takes well under a second; the bound only matters for a worker that dies meanwhile.
RENDEZVOUS_TIMEOUT = timedelta(seconds=30)
STAGES = ("started", "joined", "loaded", "ready")  # what a worker reports on its way up, in this order
# Test only: "<rank>:<stage>" makes that worker raise at that stage ("start", "join", "rendezvous", "load", "step");
# "<rank>:<stage>:exit" makes it exit there with code 3 and "<rank>:<stage>:hang" makes it sleep there.
FAULT_ENV = "COMPILED_ENGINE_TP_TEST_FAULT"
RUN_FROM_A_FILE = (
    "Spawned tensor-parallel workers re-import the main module: run the script from a file (not standard input) "
    "and create the LLM under `if __name__ == \"__main__\":`."
)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def device_for_rank(device: torch.device, rank: int) -> torch.device:
    return torch.device("cuda", rank) if device.type == "cuda" else torch.device("cpu")


class WorkerError(RuntimeError):
    """A tensor-parallel worker failed; the message carries its traceback."""


class TensorParallelWorkers:
    """Rank 0's handle on ranks 1..N-1."""

    def __init__(self, world_size: int, device: torch.device, worker_args: dict):
        check_main_module_importable()
        # NVLink multicast stays off (it can take a shared host's GPUs out of service); children inherit this.
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        # NCCL errors and timeouts abort the communicators without killing the process (torch's default kills it):
        # what abort_collectives_when_a_worker_dies does itself, and the watchdog must not answer it with a kill.
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
        self.world_size = world_size
        self.device = device
        context = mp.get_context("spawn")
        self.reports = context.Queue()
        self.stages_seen: dict[int, set[str]] = {rank: set() for rank in range(1, world_size)}
        # Port 0: the OS picks a free one. wait_for_workers=False: the constructor returns at once, and rank 0 waits
        # for the workers' connections in Python (wait_for "joined"), where a dead worker is seen.
        store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True, timeout=RENDEZVOUS_TIMEOUT,
                              wait_for_workers=False)
        self.processes = [
            context.Process(
                target=worker_main,
                args=(rank, world_size, store.port, device.type, worker_args, self.reports),
                daemon=True,
                name=f"compiled_engine-tp{rank}",
            )
            for rank in range(1, world_size)
        ]
        self.closed = False
        self.group_lock = threading.Lock()  # leaving the process group vs the watch thread's abort of it
        # An owner that never calls close() must not hang the interpreter's exit: the workers would sit in their
        # next broadcast, and rank 0's process group in its teardown (seen in the TP=2 bench). atexit runs
        # this before multiprocessing's own exit handler, which was registered earlier.
        atexit.register(self.shutdown_at_exit)
        try:
            for process in self.processes:
                process.start()
            # Wait in Python, where a dead worker is seen and Ctrl-C is delivered, until every worker is connected
            # to the store; only then enter init_process_group, which blocks in C++ (RENDEZVOUS_TIMEOUT at most).
            self.wait_for("joined", JOIN_TIMEOUT_S)
            try:
                join_process_group(store, 0, world_size, device)
            except Exception as error:  # a worker died after it joined the store: name it, not the timeout
                self.raise_worker_error(error)
        except BaseException:  # KeyboardInterrupt included: no worker and no process group may outlive this
            self.abort()
            raise
        self.tp = TensorParallel(rank=0, world_size=world_size)
        if device.type == "cuda":
            threading.Thread(target=self.abort_collectives_when_a_worker_dies, daemon=True,
                             name="compiled_engine-tp-watch").start()

    def abort_collectives_when_a_worker_dies(self) -> None:
        """NCCL only, on a daemon thread: wait for any worker process to end; one that ends while the workers serve
        (neither ``shutdown`` nor ``abort`` stopped it) makes this process abort its NCCL communicators.

        A rank that dies inside a collective leaves the others' NCCL kernels waiting for it until the collective
        timeout (10 min), and rank 0's host waiting on them (a token read-back), deaf to anything else. The abort
        ends those kernels: rank 0's step returns (its outputs meaningless) and its next command fails, which
        ``_command`` (or ModelExecutor.execute) raises as the WorkerError naming the dead worker. gloo needs none of
        this: a dead peer's closed sockets end its collectives at once.
        """
        wait_for_any([process.sentinel for process in self.processes])
        with self.group_lock:
            if not self.closed and dist.is_initialized():
                dist.distributed_c10d._abort_process_group()

    # ---------------------------------------------------------------------------------------------- handshakes
    def wait_for(self, stage: str, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        """Block until every worker has reported ``stage``; raise the first worker error (or a dead worker) instead.

        Workers report asynchronously, so a fast one may already have reported a later stage: each rank's stages
        are remembered, and only a message that is not a stage name (a traceback) is an error.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            pending = {rank for rank in range(1, self.world_size) if stage not in self.stages_seen[rank]}
            if not pending:
                return
            try:
                rank, message = self.reports.get(timeout=0.5)
            except queue.Empty:
                self.raise_if_dead()
                if time.monotonic() > deadline:
                    raise WorkerError(f"tensor-parallel workers {sorted(pending)} did not reach {stage!r} in time")
                continue
            if message not in STAGES:
                raise WorkerError(f"tensor-parallel worker {rank} failed:\n{message}")
            self.stages_seen[rank].add(message)

    def raise_if_dead(self) -> None:
        """Raise a WorkerError naming the first worker process that has exited, if any."""
        for rank, process in enumerate(self.processes, start=1):
            if not process.is_alive():
                message = f"tensor-parallel worker {process.name} exited with code {process.exitcode}"
                if "started" not in self.stages_seen[rank]:  # (a report put just before a hard exit may be lost)
                    message += (f" before it reported that it started; if it died while importing the main module,"
                                f" its error is printed above. {RUN_FROM_A_FILE}")
                raise WorkerError(message)

    def raise_worker_error(self, error: BaseException) -> NoReturn:
        """Turn a failed collective or rendezvous into the worker's own error: the traceback a worker reported
        (within 5 s), else the exit code of a worker that died; ``error`` itself when every worker lives on."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                rank, message = self.reports.get(timeout=0.5)
            except queue.Empty:
                try:
                    self.raise_if_dead()
                except WorkerError as dead:
                    raise dead from error
                continue
            if message in STAGES:
                self.stages_seen[rank].add(message)
                continue
            raise WorkerError(f"tensor-parallel worker {rank} failed:\n{message}") from error
        raise error

    # ------------------------------------------------------------------------------------------------ commands
    def _command(self, values: list[int]) -> None:
        """Broadcast a command header to the workers (which must still be running). A failed broadcast (a dead
        worker: gloo's closed socket, or the group aborted by ``abort_collectives_when_a_worker_dies``) stops the
        workers and raises the worker's error, whichever command it was (a step's, a slot reset's...)."""
        if self.closed:
            raise RuntimeError("the tensor-parallel workers are stopped (closed, or a step failed)")
        try:
            dist.broadcast(self._header(values), 0)
        except Exception as error:
            try:
                self.raise_worker_error(error)
            finally:
                self.abort()

    def _header(self, values: list[int]) -> torch.Tensor:
        return upload(torch.tensor(values + [0] * (HEADER_SIZE - len(values)), dtype=torch.int64), self.device)

    def send_step(self, step: StepInputs, all_logits: bool, keep_hidden: bool = False) -> None:
        """A step (``keep_hidden``: ModelExecutor.forward_keeping_hidden's, speculative decoding's prefill and
        verify steps)."""
        self._command([CMD_STEP, *step_shape(step), int(all_logits), int(keep_hidden)])
        for tensor in step_tensors(step):
            dist.broadcast(tensor.contiguous(), 0)

    def send_draft(self, next_ids: torch.Tensor, rows: torch.Tensor, seq_rows: torch.Tensor, num_drafts: int) -> None:
        self._command([CMD_DRAFT, next_ids.shape[0], rows.shape[0], num_drafts])
        dist.broadcast(torch.cat([next_ids, rows, seq_rows]), 0)

    def send_accept(self, num_accepted: torch.Tensor, tokens: torch.Tensor) -> None:
        self._command([CMD_ACCEPT, tokens.shape[0], tokens.shape[1] - 1])
        dist.broadcast(torch.cat([num_accepted, tokens.reshape(-1)]), 0)

    def send_compile_rounds(self) -> None:
        self._command([CMD_COMPILE_ROUNDS])

    def send_round_buffers(self, bucket: int, sample: bool, buffers: list[torch.Tensor]) -> None:
        """A compiled round: rank 0's loaded buffers (SpeculativeRound.buffers) into each worker's own."""
        self._command([CMD_ROUND_BUFFERS, bucket, int(sample)])
        for tensor in buffers:
            dist.broadcast(tensor, 0)

    def send_round(self, step: StepInputs, num_drafts: int, sampling: tuple[torch.Tensor, ...] | None) -> None:
        """A fused round's verify step, and the rows' sampling parameters (fp32 temperature, top_p, min_p; int64
        top_k, seeds, counters) when it samples."""
        self._command([CMD_ROUND, *step_shape(step), num_drafts, int(sampling is not None)])
        for tensor in step_tensors(step):
            dist.broadcast(tensor.contiguous(), 0)
        if sampling is not None:
            temperature, top_k, top_p, min_p, seeds, counters = sampling
            dist.broadcast(torch.stack([temperature, top_p, min_p]), 0)
            dist.broadcast(torch.stack([top_k, seeds, counters]), 0)

    def send_reset_slot(self, slot: int) -> None:
        self._command([CMD_RESET_SLOT, slot])

    def send_snapshot(self, direction: str, row: int, slot: int) -> None:
        """Mirror a prefix-cache snapshot copy (compiled_engine/prefix_cache.py) on every worker."""
        command = CMD_SNAPSHOT_SAVE if direction == SAVE else CMD_SNAPSHOT_RESTORE
        self._command([command, row, slot])

    def send_compile(self) -> None:
        self._command([CMD_COMPILE])

    def abort(self) -> None:
        """Kill the workers without a goodbye: after a failed step they may sit in a collective rank 0 left."""
        self.closed = True
        atexit.unregister(self.shutdown_at_exit)
        for process in self.processes:
            if process.is_alive():
                process.kill()
            if process.pid is not None:  # started (an interrupted start may not have started them all)
                process.join()
        with self.group_lock:
            leave_process_group(self.device)

    def shutdown_at_exit(self) -> None:
        """``shutdown`` at interpreter exit: after an uncaught exception (sys.last_value: a KeyboardInterrupt in a
        step, say) the workers may sit in a collective, so they are killed."""
        if getattr(sys, "last_value", None) is not None:
            self.abort()
        else:
            self.shutdown()

    def shutdown(self) -> None:
        """Stop the workers and leave the process group; safe to call twice and after errors.

        While an exception propagates (``with`` exits, ``except`` blocks) the ranks may be out of lockstep, so the
        workers are killed instead of told to stop (module docstring).
        """
        if self.closed:
            return
        if sys.exc_info()[1] is not None:
            self.abort()
            return
        self.closed = True
        atexit.unregister(self.shutdown_at_exit)
        if dist.is_initialized():
            alive = all(p.is_alive() for p in self.processes)
            try:
                if alive:
                    dist.broadcast(self._header([CMD_STOP]), 0)
            except Exception:  # a dead peer: nothing to tell it
                pass
            with self.group_lock:
                leave_process_group(self.device)
        for process in self.processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
                process.join()


def check_main_module_importable() -> None:
    """Raise before spawning when a spawned worker could not re-import the main module (multiprocessing's spawn
    runs the main module's file again: a script read from standard input has none, and the worker would die before
    it joins)."""
    main = sys.modules.get("__main__")
    if main is None or getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return  # python -m: re-imported by name
    path = getattr(main, "__file__", None)
    if path is not None and not os.path.exists(path):
        raise RuntimeError(f"cannot start tensor-parallel workers: the main module's file {path!r} does not exist. "
                           f"{RUN_FROM_A_FILE}")


def leave_process_group(device: torch.device) -> None:
    """``destroy_process_group``, after freeing this process's CUDA graphs (or only the group count after a
    failed start).

    NCCL cannot destroy a communicator while a CUDA graph that captured its collectives exists: ncclCommDestroy
    waits for those graphs to go (pytorch/pytorch#115388). The decode graphs hold every all-reduce of the step, and
    without this both ranks of a TP=2 run hang there after their last step.
    The graphs are cudagraph trees', which are per process, so all of this process's go: these ranks cannot step
    any more, and any other compiled function records its graphs again on its next call.
    A group that ``abort_collectives_when_a_worker_dies`` aborted is gone already; its graphs still go.
    """
    if device.type == "cuda":
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees

        reset_cudagraph_trees()
        gc.collect()  # the graphs' last references may sit in reference cycles
    if not dist.is_initialized():
        # A failed init_process_group has still counted the group it did not make, and the group's name (hence its
        # store keys) comes from that count: reset it as destroy_process_group does, so that the next start's
        # fresh workers, which count from 0, meet this process under the same name.
        dist.distributed_c10d._world.group_count = 0
        return
    dist.destroy_process_group()


def join_process_group(store: dist.Store, rank: int, world_size: int, device: torch.device) -> None:
    """The default process group over ``store``. Its rendezvous (the backend's address exchange through the store)
    waits at most RENDEZVOUS_TIMEOUT; then the store's waits and the group's collectives may take COLLECTIVE_TIMEOUT:
    a rank may spend minutes loading or compiling while the others wait in a broadcast, or in the store for NCCL's
    unique id, which the ranks exchange at their first collective."""
    store.set_timeout(RENDEZVOUS_TIMEOUT)
    dist.init_process_group(backend_for(device), store=store, rank=rank, world_size=world_size,
                            timeout=RENDEZVOUS_TIMEOUT)
    store.set_timeout(COLLECTIVE_TIMEOUT)
    dist.distributed_c10d._set_pg_timeout(COLLECTIVE_TIMEOUT)


def step_shape(step: StepInputs) -> list[int]:
    """What a worker needs to receive a step: its token, sequence and block-table column counts, its kind and its
    decode rows."""
    return [step.input_ids.shape[0], step.state_slots.shape[0], step.block_tables.shape[1], int(step.is_prefill),
            int(step.speculative), step.decode_rows]


def step_tensors(step: StepInputs) -> list[torch.Tensor]:
    tensors = [
        step.input_ids, step.positions, step.slot_mapping, step.block_tables, step.context_lens, step.state_slots
    ]
    if step.is_prefill:
        tensors.append(step.cu_seqlens)
    if step.decode_rows:
        tensors.append(step.prompt_cu_seqlens)
    return tensors


def receive_step(header: list[int], device: torch.device) -> StepInputs:
    """The step whose ``step_shape`` is ``header[1:7]``, from rank 0's broadcasts."""
    _, tokens, seqs, max_blocks, is_prefill, speculative, decode_rows = header[:7]
    shapes = [
        ((tokens,), torch.long),
        ((tokens,), torch.long),
        ((tokens,), torch.long),
        ((seqs, max_blocks), torch.int32),
        ((seqs,), torch.int32),
        ((seqs,), torch.int32),
    ]
    if is_prefill:
        shapes.append(((seqs + 1,), torch.int32))
    if decode_rows:
        shapes.append(((seqs - decode_rows + 1,), torch.int32))
    tensors = [receive(shape, dtype, device) for shape, dtype in shapes]
    step = StepInputs(*tensors[:6], cu_seqlens=tensors[6] if is_prefill else None, is_prefill=bool(is_prefill),
                      speculative=bool(speculative), decode_rows=decode_rows,
                      prompt_cu_seqlens=tensors[7] if decode_rows else None)
    if is_prefill:
        # One int64 copy for the whole step, which every linear layer hands FLA: it derives the chunk indices (with
        # a host sync) in the first layer only and memoises them on this object's identity for the others. Rank 0
        # has them from pack_step, computed on the host; a worker does not know the lengths on the host.
        step.cu_seqlens_long = step.linear_cu_seqlens.long()
    return step


def receive(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A tensor rank 0 broadcasts."""
    tensor = torch.empty(shape, dtype=dtype, device=device)
    dist.broadcast(tensor, 0)
    return tensor


def _maybe_fail(rank: int, stage: str) -> None:
    """Test only: the fault FAULT_ENV names for this rank at this stage."""
    fault = os.environ.get(FAULT_ENV, "").split(":")
    if fault[:2] != [str(rank), stage]:
        return
    action = fault[2] if len(fault) > 2 else "raise"
    if action == "exit":
        os._exit(3)
    if action == "hang":
        time.sleep(3600)
    raise RuntimeError(f"injected fault in worker {rank} at {stage!r} ({FAULT_ENV})")


def worker_main(rank: int, world_size: int, port: int, device_type: str, args: dict, reports) -> None:
    """Entry point of rank ``rank`` (a spawned process)."""
    device = device_for_rank(torch.device(device_type), rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    try:
        _maybe_fail(rank, "start")
        reports.put((rank, "started"))
        _maybe_fail(rank, "join")
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=RENDEZVOUS_TIMEOUT)
        reports.put((rank, "joined"))
        _maybe_fail(rank, "rendezvous")
        join_process_group(store, rank, world_size, device)
        tp = TensorParallel(rank=rank, world_size=world_size)
        _maybe_fail(rank, "load")
        config, dtype = args["runtime_config"], args["dtype"]
        model, _ = load_model(args["path"], args["model_config"], device, dtype, tp=tp,
                              attention_backend=config.attention_backend, mtp=config.speculative_config is not None,
                              weights=args["weights"])
        reports.put((rank, "loaded"))
        max_model_len = config.max_model_len or model.config.max_position_embeddings
        _, prefix_cache = allocate_caches(model, config, max_model_len, device, dtype)
        executor = ModelExecutor(model, config.block_size, config.max_num_seqs, max_model_len, device,
                                 speculative_config=config.speculative_config)
        reports.put((rank, "ready"))
        serve(executor, prefix_cache, rank, device)
    except BaseException:
        reports.put((rank, traceback.format_exc()))
    finally:
        leave_process_group(device)
        # Then exit without the interpreter's teardown: a worker's final garbage collection can take longer than
        # its work (seconds on a large model), and rank 0's close() would wait for it. Its reports are flushed
        # first; the OS and the driver free the rest.
        reports.close()
        reports.join_thread()
        os._exit(0)


@torch.inference_mode()
def serve(executor: ModelExecutor, prefix_cache: PrefixCache | None, rank: int, device: torch.device) -> None:
    """Run rank 0's commands until it says stop: steps (outputs dropped: rank 0 samples), slot resets, prefix-cache
    snapshot copies, the decode compile and speculative decoding's drafts, commits and rounds (the same device work
    as rank 0's, so every rank computes the same accepted tokens and drafts), in the order rank 0 issues them."""
    header = torch.empty(HEADER_SIZE, dtype=torch.int64, device=device)
    while True:
        dist.broadcast(header, 0)
        values = header.tolist()
        command = values[0]
        if command == CMD_STOP:
            return
        if command == CMD_STEP:
            _maybe_fail(rank, "step")
            step, (all_logits, keep_hidden) = receive_step(values, device), values[7:9]
            if keep_hidden:
                executor.forward_keeping_hidden(step, bool(all_logits))
            else:
                executor.execute(step, bool(all_logits))
        elif command == CMD_DRAFT:
            t, d, k = values[1:4]
            packed = receive((t + 2 * d,), torch.long, device)
            executor.draft(*executor.kept, packed[:t], packed[t : t + d], packed[t + d :], k)
            executor.kept = None  # its one use: free the step's hidden states
        elif command == CMD_ACCEPT:
            n, k = values[1:3]
            packed = receive((n * (k + 2),), torch.long, device)
            executor.accept(*executor.kept, packed[:n], packed[n:].view(n, k + 1))
            executor.kept = None
        elif command == CMD_ROUND:
            step, (k, sample) = receive_step(values, device), values[7:9]
            sampling = None
            if sample:
                rows = step.input_ids.shape[0]
                temperature, top_p, min_p = receive((3, rows), torch.float32, device)
                top_k, seeds, counters = receive((3, rows), torch.long, device)
                sampling = (temperature, top_k, top_p, min_p, seeds, counters)
            executor.fused_round(step, k, sampling)
        elif command == CMD_COMPILE_ROUNDS:
            executor.compile_rounds()
        elif command == CMD_ROUND_BUFFERS:
            bucket, sample = values[1], bool(values[2])
            round_ = executor.speculative_round
            for tensor in round_.buffers(bucket, sample):
                dist.broadcast(tensor, 0)
            round_.run(bucket, sample)  # its results (this process's host rows too) go unread: rank 0 reads its own
        elif command == CMD_RESET_SLOT:
            executor.reset_state_slots([values[1]])
        elif command == CMD_SNAPSHOT_SAVE:
            prefix_cache.save_state(values[2], values[1])
        elif command == CMD_SNAPSHOT_RESTORE:
            prefix_cache.restore_state(values[1], values[2])
        elif command == CMD_COMPILE:
            executor.compile_decode()
        else:
            raise RuntimeError(f"unknown tensor-parallel command {command}")
