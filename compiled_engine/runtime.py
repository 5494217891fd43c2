"""Runtime: the model, its caches, and a step API for systems that embed compiled_engine.

    rt = Runtime.from_pretrained(path, device="cuda", dtype=torch.bfloat16)
    seq = rt.add_sequence(prompt_token_ids)       # takes a state slot (zeroed)
    logits = rt.prefill([seq])                     # [1, vocab] fp32: logits after the last prompt token
    seq.token_ids.append(next_token)
    logits = rt.decode_step([seq])                 # one new token per sequence: [1, vocab] fp32
    out = rt.decode([seq])                         # the same step as the engine runs it: out.greedy_tokens [1],
                                                   # out.logits in the model dtype, valid until the next decode
    rt.release(seq)                                # frees its KV blocks and its state slot

``prefill`` runs every not-yet-computed token of each sequence (or ``num_tokens[i]`` of them: chunked prefill) as
one varlen batch; ``decode_step`` runs exactly one token per sequence. Both allocate KV blocks as needed and raise
``OutOfBlocksError`` when the cache is full (the scheduler checks ``can_append`` first and preempts instead).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import weakref
from typing import Iterator, Sequence as Seq

import torch

from compiled_engine.cache import (
    BlockAllocator,
    CacheConfig,
    SlotAllocator,
    allocate_kv_cache,
    allocate_state_pools,
    kv_bytes_per_block,
    reset_state_slot,
    reset_state_slots,
)
from compiled_engine.config import ModelConfig
from compiled_engine.distributed import check_divisible
from ops.flash_attention import check_flash_attn_usable
from compiled_engine.gated_deltanet import GatedDeltaNet
from compiled_engine.loader import load_model
from compiled_engine.model import DecodeOutput, HybridModel
from compiled_engine.prefix_cache import PrefixCache, PrefixHit
from compiled_engine.sequence import Sequence
from compiled_engine.step_inputs import StepInputs, pack_step
from compiled_engine.tp_workers import TensorParallelWorkers
from ops.library import NULL_BLOCK, NULL_SLOT

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CPU_KV_CACHE_BYTES = 1 << 30  # default KV budget on CPU, where no device memory can be measured


class OutOfBlocksError(RuntimeError):
    """The KV cache has no free block for the requested step."""


# Prefill steps run at start-up after the largest one, for their shapes, not their memory: Triton compiles a kernel
# variant per class of each integer argument (1, a multiple of 16, anything else), and FLA's chunked delta-rule
# kernels take the step's token and sequence counts, so a class first met while serving would compile in the middle
# of it. These lengths give one sequence and several, token totals that are multiples of 16 and totals that are
# not.
WARMUP_PREFILL_LENGTHS = ([17], [17, 20], [16, 16])
# FLA's l2norm kernel (q and k of every linear-attention layer) autotunes per bucket NB = cdiv(rows, 65536) of its
# rows, rows = tokens x key heads (fla/modules/norm/l2norm.py, fla-core 0.6). A bucket first met while serving is
# ~10 s of Triton compiles and timed launches inside that step: on the H200 (run 12), with 16,384-token steps, the
# last prefill (11,755 tokens, bucket 3 of 4) took 10.2 s. So start-up runs one prefill in every bucket.
FLA_L2NORM_BUCKET_ROWS = 65536


def default_max_num_batched_tokens(device: torch.device) -> int:
    """vLLM's default token budget of a prefill step for offline use (its ``LLM`` class): 16,384 on a GPU of 70 GiB
    or more, 8,192 elsewhere (CPU included). On the H200, 16,384 against 8,192 on the throughput workload: 31,579
    against 26,518 output tok/s, TTFT p50 336 against 758 ms (bench/results/h200-2026-11-29/run17-session)."""
    if device.type == "cuda" and torch.cuda.get_device_properties(device).total_memory >= 70 * 2**30:
        return 16384
    return 8192


def largest_prefill_lengths(max_num_batched_tokens: int, max_model_len: int, max_num_seqs: int) -> list[int]:
    """Sequence lengths of the largest prefill step the scheduler can build: ``max_num_batched_tokens`` tokens in
    all (fewer only if ``max_num_seqs`` full-length sequences hold fewer), no sequence over ``max_model_len``.

    The start-up step must be this large, not one sequence of at most ``max_model_len``: FLA tunes its l2norm kernel
    per bucket of the step's token count, and a cold tune (25 Triton compiles) inside the first served step took it to
    12.5 s on the H200 (bench/results/h200-2026-11-29/run6-session); the activation peak of the memory plan was
    undercounted the same way.
    """
    total = min(max_num_batched_tokens, max_model_len * max_num_seqs)
    full, rest = divmod(total, max_model_len)
    return [max_model_len] * full + ([rest] if rest else [])


def l2norm_bucket_totals(largest_total: int, key_heads: int) -> list[int]:
    """A token total in each of FLA's l2norm buckets below the largest step's (``FLA_L2NORM_BUCKET_ROWS``): the top
    of each, ``b`` buckets' worth of rows. ``key_heads``: linear-attention key heads on this rank."""
    per_bucket = max(1, FLA_L2NORM_BUCKET_ROWS // key_heads)
    largest_bucket = math.ceil(largest_total * key_heads / FLA_L2NORM_BUCKET_ROWS)
    return [b * per_bucket for b in range(1, largest_bucket)]


class _NullSequence:
    """What ``pack_step`` reads of a sequence, for a start-up step: ``n`` zero tokens on the null block and slot."""

    def __init__(self, n: int, block_size: int):
        self.token_ids = [0] * n
        self.num_computed_tokens = 0
        self.block_table = [NULL_BLOCK] * math.ceil(n / block_size)
        self.state_slot = NULL_SLOT


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """Knobs of the runtime. See README "Knobs"."""

    max_model_len: int | None = None  # default: the model's max_position_embeddings
    max_num_seqs: int = 256  # concurrent sequences (state slots)
    block_size: int = 16
    num_kv_blocks: int | None = None  # overrides the memory plan
    gpu_memory_utilization: float = 0.9
    state_dtype: torch.dtype = torch.float32
    max_num_batched_tokens: int = 8192  # the largest prefill step: sizes the activation peak of the memory plan
    enable_prefix_caching: bool = False
    prefix_snapshot_interval: int = 512  # tokens between linear-state snapshots (multiple of block_size and 64)
    num_prefix_snapshots: int = 64  # snapshot pool size (each holds one sequence's state of every linear layer)
    attention_backend: str = "triton"  # or "flash_attn" where installed (block_size a multiple of 256)

    def validate(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if not isinstance(self.block_size, int) or self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two, got {self.block_size}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise ValueError(f"num_kv_blocks must be >= 2 (block 0 is reserved), got {self.num_kv_blocks}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.attention_backend not in ("triton", "flash_attn"):
            raise ValueError(f"attention_backend must be 'triton' or 'flash_attn', got {self.attention_backend!r}")
        if self.state_dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"state_dtype must be float32 or bfloat16, got {self.state_dtype}")


def resolve_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but torch sees no CUDA device")
    return device


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None:  # bf16 on GPUs; fp32 on CPU, where bf16 matmuls are slow and tests compare with HF in fp32
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        return DTYPES[dtype]
    return dtype


class Runtime:
    def __init__(
        self,
        model: HybridModel,
        config: RuntimeConfig,
        device: torch.device,
        dtype: torch.dtype,
        workers: TensorParallelWorkers | None = None,
    ):
        """``workers``: the other tensor-parallel ranks, when this is rank 0 of a sharded model."""
        config.validate()
        self.model = model
        self.workers = workers
        self.model_config: ModelConfig = model.config
        self.config = config
        self.device = device
        self.dtype = dtype
        self.max_model_len = config.max_model_len or self.model_config.max_position_embeddings
        num_slots = config.max_num_seqs + 1  # + the null slot
        allocate_state_pools(model, num_slots, device, dtype, config.state_dtype)
        self.prefix_cache: PrefixCache | None = None
        if config.enable_prefix_caching:  # its snapshot pool is allocated before the KV plan takes the rest
            self.prefix_cache = PrefixCache(
                model, config.block_size, config.prefix_snapshot_interval, config.num_prefix_snapshots,
                device, dtype, config.state_dtype,
            )
            if workers is not None:
                self.prefix_cache.mirror = workers.send_snapshot
        num_kv_blocks = config.num_kv_blocks or self._plan_kv_blocks()
        self.cache_config = CacheConfig(config.block_size, num_kv_blocks, num_slots, config.state_dtype)
        blocks_for_one = math.ceil(self.max_model_len / config.block_size)
        if blocks_for_one > num_kv_blocks - 1:
            raise ValueError(
                f"one max_model_len={self.max_model_len} sequence needs {blocks_for_one} KV blocks but only "
                f"{num_kv_blocks - 1} fit: lower max_model_len or raise num_kv_blocks / gpu_memory_utilization"
            )
        allocate_kv_cache(model, num_kv_blocks, config.block_size, device, dtype)
        self.blocks = BlockAllocator(num_kv_blocks)
        self.slots = SlotAllocator(self.cache_config.num_state_slots)
        if self.prefix_cache is not None:
            self.prefix_cache.bind_blocks(self.blocks)
        self._next_seq_id = 0
        self._queued_resets: list[int] | None = None  # fresh slots to zero, inside batched_admissions()
        # ``decode_fn(step) -> DecodeOutput``: a decode step's logits and greedy tokens. It may name the device it
        # wants its steps built on as ``decode_fn.step_device`` (the runtime's device otherwise). Replaced by
        # graphs.DecodeGraphRunner when decode is compiled, whose outputs are valid only until its next call; the
        # eager path is the model itself.
        self.decode_fn = self._decode_eager
        logger.info(
            "KV cache: %d blocks of %d tokens (%d tokens); %d state slots; concurrency limit %d sequences "
            "of max_model_len=%d",
            num_kv_blocks - 1,
            config.block_size,
            (num_kv_blocks - 1) * config.block_size,
            config.max_num_seqs,
            min(config.max_num_seqs, (num_kv_blocks - 1) // blocks_for_one),
            self.max_model_len,
        )

    # ----------------------------------------------------------------------------------------------- construction
    @classmethod
    def from_pretrained(
        cls,
        path: str,
        *,
        device: str | torch.device | None = None,
        dtype: str | torch.dtype | None = None,
        tensor_parallel_size: int = 1,
        progress: bool = False,
        **runtime_config,
    ) -> "Runtime":
        """Load a checkpoint folder (config.json + safetensors). ``runtime_config``: fields of RuntimeConfig.

        ``tensor_parallel_size`` N > 1 shards the model over N processes (this one is rank 0; on CUDA rank r uses
        GPU r). Call ``close()`` (or use ``with``) to stop them; they also stop when this process exits.
        """
        device = resolve_device(device)
        dtype = resolve_dtype(dtype, device)
        config = ModelConfig.from_pretrained(path)
        known = {f.name for f in dataclasses.fields(RuntimeConfig)}
        unknown = sorted(set(runtime_config) - known)
        if unknown:
            raise ValueError(f"unknown runtime option(s) {unknown}; known options: {sorted(known)}")
        runtime_config = RuntimeConfig(**runtime_config)
        runtime_config.validate()
        backend = runtime_config.attention_backend
        if backend == "flash_attn":
            check_flash_attn_usable(device, dtype, runtime_config.block_size)
        if tensor_parallel_size == 1:
            model, report = load_model(path, config, device, dtype, progress=progress, attention_backend=backend)
            runtime = cls(model, runtime_config, device, dtype)
            runtime.load_report = report
            return runtime
        if not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
            raise ValueError(f"tensor_parallel_size must be an int >= 1, got {tensor_parallel_size!r}")
        check_divisible(config, tensor_parallel_size)
        if device.type == "cuda" and torch.cuda.device_count() < tensor_parallel_size:
            raise ValueError(f"tensor_parallel_size={tensor_parallel_size} needs that many GPUs; "
                             f"{torch.cuda.device_count()} visible")
        if device.type == "cuda":
            device = torch.device("cuda", 0)
            torch.cuda.set_device(device)
        args = {"path": path, "model_config": config, "dtype": dtype, "runtime_config": runtime_config}
        workers = TensorParallelWorkers(tensor_parallel_size, device, args)
        try:
            model, report = load_model(
                path, config, device, dtype, progress=progress, tp=workers.tp, attention_backend=backend
            )
            workers.wait_for("loaded")  # before any collective: a worker that failed to load raises here
            runtime = cls(model, runtime_config, device, dtype, workers=workers)
            workers.wait_for("ready")
        except BaseException:
            workers.shutdown()
            raise
        runtime.load_report = report
        weakref.finalize(runtime, workers.shutdown)
        return runtime

    def close(self) -> None:
        """Stop tensor-parallel workers (no-op without them)."""
        if self.workers is not None:
            self.workers.shutdown()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _plan_kv_blocks(self) -> int:
        """KV blocks from the memory left after weights, state pools and the measured activation peak.

        On CUDA: run the largest prefill step and the largest decode step on throwaway caches, measure the peak,
        and give KV blocks what ``gpu_memory_utilization`` leaves. On CPU: a fixed budget (CPU_KV_CACHE_BYTES).
        """
        block_bytes = kv_bytes_per_block(self.model, self.config.block_size, self.dtype)
        if block_bytes == 0:  # no attention layer: blocks cost nothing, so give every sequence its full length
            return self.config.max_num_seqs * math.ceil(self.max_model_len / self.config.block_size) + 1
        wanted = self.config.max_num_seqs * math.ceil(self.max_model_len / self.config.block_size) + 1
        if self.device.type != "cuda":
            return max(2, min(wanted, CPU_KV_CACHE_BYTES // block_bytes))
        peak = self._measure_activation_peak()
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        budget = total * self.config.gpu_memory_utilization - (total - free) - peak
        blocks = int(budget // block_bytes)
        if self.model.tp.world_size > 1:  # every rank must have the same blocks: take the smallest plan
            agreed = torch.tensor([blocks], device=self.device)
            torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MIN)
            blocks = int(agreed.item())
        logger.info(
            "memory plan: %.2f GiB in use (weights, state pools), activation peak %.2f GiB, %.2f GiB for KV",
            (total - free) / 2**30, peak / 2**30, max(budget, 0) / 2**30,
        )
        return max(2, min(wanted, blocks))

    @torch.inference_mode()
    def _measure_activation_peak(self) -> int:
        """Peak bytes of the largest prefill (max_num_batched_tokens tokens) and decode (max_num_seqs) steps.

        The steps run on a 2-block KV cache with every token routed to the null block and every sequence to the
        null slot: the numbers are garbage, the memory traffic and allocation pattern are real. They are packed by
        ``pack_step``, as served steps are, and smaller prefills follow the largest one, for the kernel variants and
        autotuning buckets they meet: see ``FLA_L2NORM_BUCKET_ROWS`` and ``WARMUP_PREFILL_LENGTHS``.
        """
        block_size = self.config.block_size
        allocate_kv_cache(self.model, 2, block_size, self.device, self.dtype)
        largest = largest_prefill_lengths(self.config.max_num_batched_tokens, self.max_model_len,
                                          self.config.max_num_seqs)
        halves = [n for piece in largest for n in (piece // 2, piece - piece // 2) if n]  # more sequences, same total
        key_heads = next((m.num_k_heads for m in self.model.modules() if isinstance(m, GatedDeltaNet)), None)
        totals = l2norm_bucket_totals(sum(largest), key_heads) if key_heads else []
        buckets = [largest_prefill_lengths(total, self.max_model_len, self.config.max_num_seqs) for total in totals]

        def step(lengths: list[int], is_prefill: bool) -> StepInputs:
            seqs = [_NullSequence(n, block_size) for n in lengths]
            return pack_step(seqs, lengths if is_prefill else [1] * len(seqs), is_prefill, block_size, self.device)

        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        baseline = torch.cuda.memory_allocated(self.device)
        for lengths in (largest, halves, *buckets, *WARMUP_PREFILL_LENGTHS):
            prefill = step(lengths, True)
            self.model.compute_logits(self.model(prefill)[prefill.last_token_indices()])
        decode = step([1] * self.config.max_num_seqs, False)
        self.model.compute_logits(self.model(decode))
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - baseline
        reset_state_slot(self.model, NULL_SLOT)
        return peak

    # ----------------------------------------------------------------------------------------- sequence lifecycle
    def validate_prompt(self, token_ids: Seq[int]) -> list[int]:
        token_ids = list(token_ids)
        if not token_ids:
            raise ValueError("prompt is empty: at least one token is needed")
        if len(token_ids) > self.max_model_len:
            raise ValueError(f"prompt has {len(token_ids)} tokens, more than max_model_len={self.max_model_len}")
        vocab = self.model_config.vocab_size
        bad = [t for t in token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token id {bad[0]!r} is out of range [0, {vocab})")
        return token_ids

    def add_sequence(self, prompt_token_ids: Seq[int]) -> Sequence:
        """Register a sequence and give it a state slot (zeroed, or restored from a prefix-cache hit).

        KV blocks are taken as its tokens are computed.
        """
        token_ids = self.validate_prompt(prompt_token_ids)
        if self.slots.num_free == 0:
            raise RuntimeError(f"all {self.config.max_num_seqs} state slots are in use (max_num_seqs)")
        seq = Sequence(self.new_seq_id(), token_ids, len(token_ids))
        hit = self.find_cached_prefix(seq)
        if hit is not None and hit.num_evictable > self.blocks.num_free:
            hit = None
        self.assign_slot(seq, hit)
        return seq

    def new_seq_id(self) -> int:
        self._next_seq_id += 1
        return self._next_seq_id - 1

    def find_cached_prefix(self, seq: Sequence) -> PrefixHit | None:
        """The prefix-cache hit a sequence would get if admitted now (None when caching is off or nothing hits)."""
        return self.prefix_cache.find(seq) if self.prefix_cache is not None else None

    def assign_slot(self, seq: Sequence, hit: PrefixHit | None = None) -> None:
        """Give the sequence a state slot: zeroed, or restored from the prefix-cache ``hit`` (sharing its blocks)."""
        seq.state_slot = self.slots.allocate()
        seq.num_cached_tokens = 0
        if hit is None:
            if self.workers is not None:
                self.workers.send_reset_slot(seq.state_slot)
            if self._queued_resets is not None:  # inside batched_admissions(): zeroed with the others at its end
                self._queued_resets.append(seq.state_slot)
            else:
                reset_state_slot(self.model, seq.state_slot)
        else:
            self.prefix_cache.apply(seq, hit)

    @contextlib.contextmanager
    def batched_admissions(self) -> Iterator[None]:
        """Within the block, ``assign_slot``'s state work is queued and done when it ends: one fill per state tensor
        for all the fresh slots, one gather and one scatter for all the prefix-cache restores. Nothing may read an
        assigned slot inside the block (the scheduler only admits there; the step runs after it)."""
        if self._queued_resets is not None:  # nested: the outermost block does the work
            yield
            return
        restores = self.prefix_cache.batched_restores() if self.prefix_cache is not None else contextlib.nullcontext()
        self._queued_resets = []
        try:
            with restores:
                yield
        finally:
            queued, self._queued_resets = self._queued_resets, None
            reset_state_slots(self.model, queued)

    def release(self, seq: Sequence) -> None:
        """Free the sequence's KV blocks and state slot; it can be re-run from scratch (preemption)."""
        self.blocks.release(seq.block_table)
        seq.block_table = []
        seq.num_indexed_blocks = 0
        if seq.state_slot is not None:
            self.slots.release(seq.state_slot)
            seq.state_slot = None
        seq.num_computed_tokens = 0

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        total = seq.num_computed_tokens + num_new_tokens
        return max(0, -(-total // self.config.block_size) - len(seq.block_table))

    def _reserve_blocks(self, seqs: Seq[Sequence], counts: Seq[int]) -> None:
        # blocks_needed, inlined: a method call per sequence cost ~45 µs a step at batch 256 (CPU-measured). A
        # negative need (a table already long enough) allocates nothing.
        size = self.config.block_size
        needs = [-(-(s.num_computed_tokens + n) // size) - len(s.block_table) for s, n in zip(seqs, counts)]
        total = sum(need for need in needs if need > 0)
        if total > self.blocks.num_free:
            raise OutOfBlocksError(f"step needs {total} KV blocks, {self.blocks.num_free} free")
        if total:  # in decode, a sequence needs a new block once every block_size steps
            for seq, need in zip(seqs, needs):
                for _ in range(need):
                    seq.block_table.append(self.blocks.allocate())

    # ------------------------------------------------------------------------------------------------- steps
    @torch.inference_mode()
    def prefill(
        self, seqs: Seq[Sequence], num_tokens: Seq[int] | None = None, all_logits: bool = False
    ) -> torch.Tensor:
        """Compute the next ``num_tokens[i]`` uncomputed tokens of each sequence (default: all of them).

        Returns fp32 logits ``[N, vocab]`` after each sequence's last computed token, or ``[T, vocab]`` for every
        computed token when ``all_logits`` (teacher forcing).
        """
        counts = [s.num_uncomputed_tokens for s in seqs] if num_tokens is None else list(num_tokens)
        for seq, n in zip(seqs, counts):
            if not 1 <= n <= seq.num_uncomputed_tokens:
                raise ValueError(f"sequence {seq.seq_id}: cannot compute {n} of {seq.num_uncomputed_tokens} tokens")
        step = self.build_step(seqs, counts, is_prefill=True)
        logits = self.execute(step, all_logits)
        self.record_prefixes(seqs)
        return logits

    @torch.inference_mode()
    def decode_step(self, seqs: Seq[Sequence], *, input_ids: torch.Tensor | None = None) -> torch.Tensor:
        """One new token per sequence (its last appended one). Returns fp32 logits ``[N, vocab]``, the caller's to
        keep. :meth:`decode` is the same step without the fp32 copy, plus each row's greedy token."""
        return self.decode(seqs, input_ids=input_ids).logits.float()

    @torch.inference_mode()
    def decode(self, seqs: Seq[Sequence], *, input_ids: torch.Tensor | None = None) -> DecodeOutput:
        """One new token per sequence (its last appended one): the step's ``DecodeOutput``, i.e. logits ``[N, vocab]``
        in the model's dtype and ``greedy_tokens`` ``[N]`` int64 (each row's argmax), both on the device.

        With a compiled decode these are the graph's output buffers, valid only until the next ``decode``/
        ``decode_step`` (whose replay overwrites them): for callers that consume them at once, as LLMEngine does (it
        samples from them), saving a ``[N, vocab]`` copy per step. A compiled decode also returns
        ``host_greedy_tokens``, the greedy tokens in host memory (read them within four decodes: graphs/decode_graph.py).

        ``input_ids`` (``[N]`` int64 on the runtime's device): the new tokens, instead of each sequence's last
        token on the host. LLMEngine's overlapped decode passes the previous step's sampled tokens this way, before
        the host has read them back (its sequences hold a placeholder there).
        """
        if not seqs:
            raise ValueError("a step needs at least one sequence")
        # The checks of build_step and decode's own, in one pass: this runs every step, for up to max_num_seqs.
        limit = self.max_model_len
        for seq in seqs:
            uncomputed = len(seq.token_ids) - seq.num_computed_tokens
            if uncomputed != 1:
                raise ValueError(f"sequence {seq.seq_id} has {uncomputed} uncomputed tokens; a decode step needs 1")
            if seq.state_slot is None:
                raise ValueError(f"sequence {seq.seq_id} has no state slot (released?)")
            if seq.num_computed_tokens >= limit:
                raise ValueError(f"sequence {seq.seq_id} would exceed max_model_len={limit}")
        if input_ids is not None and (
            input_ids.shape != (len(seqs),) or input_ids.dtype != torch.long or input_ids.device.type != self.device.type
        ):
            raise ValueError(f"input_ids must be [{len(seqs)}] int64 on {self.device}, got "
                             f"{tuple(input_ids.shape)} {input_ids.dtype} on {input_ids.device}")
        # A decode function may take its steps built elsewhere (``step_device``: the graph runner takes them on the
        # host, one copy into its graph's buffers); tensor-parallel ranks get theirs broadcast from the device.
        device = getattr(self.decode_fn, "step_device", self.device) if self.workers is None else self.device
        step = self._build_checked_step(seqs, [1] * len(seqs), is_prefill=False, device=device)
        if input_ids is not None:
            step = dataclasses.replace(step, input_ids=input_ids)
        out = self.execute(step)
        self.record_prefixes(seqs)
        return out

    def execute(self, step: StepInputs, all_logits: bool = False) -> torch.Tensor | DecodeOutput:
        """Run one step on the model (on every tensor-parallel rank). A prefill step returns fp32 logits of the rows
        asked for; a decode step its ``DecodeOutput`` (valid until the next decode step: ``decode``)."""
        if self.workers is None:
            return self._execute_local(step, all_logits)
        if self.workers.closed:
            raise RuntimeError("the tensor-parallel workers are stopped (closed, or a step failed)")
        try:
            self.workers.send_step(step, all_logits)
            return self._execute_local(step, all_logits)
        except Exception as error:
            # The ranks are out of lockstep now (some may wait in a collective forever): stop them, then report the
            # worker's own error if one sent it, else ours.
            try:
                self.workers.raise_worker_error(error)
            finally:
                self.workers.abort()

    def _execute_local(self, step: StepInputs, all_logits: bool) -> torch.Tensor | DecodeOutput:
        if not step.is_prefill:
            return self.decode_fn(step)
        hidden = self.model(step)
        if not all_logits:
            hidden = hidden[step.last_token_indices()]
        return self.model.compute_logits(hidden)

    def record_prefixes(self, seqs: Seq[Sequence]) -> None:
        """Enter the sequences' newly computed blocks and boundary states in the prefix cache (if on). Steps do it
        themselves; LLMEngine calls it again once an overlapped step's input tokens are read back."""
        if self.prefix_cache is not None:
            for seq in seqs:
                self.prefix_cache.record(seq)

    def _decode_eager(self, step: StepInputs) -> DecodeOutput:
        return self.model.decode_output(self.model(step))

    def build_step(self, seqs: Seq[Sequence], counts: Seq[int], is_prefill: bool) -> StepInputs:
        """Reserve KV blocks for the new tokens, then pack the step's metadata into tensors on the device."""
        if not seqs:
            raise ValueError("a step needs at least one sequence")
        for seq, n in zip(seqs, counts):
            if seq.state_slot is None:
                raise ValueError(f"sequence {seq.seq_id} has no state slot (released?)")
            if seq.num_computed_tokens + n > self.max_model_len:
                raise ValueError(f"sequence {seq.seq_id} would exceed max_model_len={self.max_model_len}")
        return self._build_checked_step(seqs, counts, is_prefill)

    def _build_checked_step(
        self, seqs: Seq[Sequence], counts: Seq[int], is_prefill: bool, device: torch.device | None = None
    ) -> StepInputs:
        """build_step after its checks (decode makes them in its own pass over the sequences), on ``device`` (the
        runtime's by default)."""
        self._reserve_blocks(seqs, counts)
        step = pack_step(seqs, counts, is_prefill, self.config.block_size, device or self.device)
        for seq, n in zip(seqs, counts):
            seq.num_computed_tokens += n
        return step
