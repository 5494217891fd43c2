"""The memory plan: how one rank's device memory is split between state pools, prefix snapshots and the KV cache.

``allocate_caches`` allocates, in this order, every linear layer's state pools (one row per sequence slot), the
prefix cache's snapshot pool (if prefix caching is on), and then as many KV blocks as the memory left allows
after the activation peak of the largest steps, which it measures by running them (``measure_activation_peak``).
Those start-up steps also meet every kernel variant and autotuning bucket that serving would otherwise meet first
in the middle of a request: see ``WARMUP_PREFILL_LENGTHS`` and ``FLA_L2NORM_BUCKET_ROWS``.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable

import torch

from compiled_engine.cache import (
    CacheConfig,
    allocate_kv_cache,
    allocate_verify_history,
    allocate_state_pools,
    kv_bytes_per_block,
    reset_state_slot,
)
from compiled_engine.config import RuntimeConfig
from compiled_engine.gated_deltanet import GatedDeltaNet
from compiled_engine.model import HybridModel
from compiled_engine.prefix_cache import PrefixCache
from compiled_engine.speculative import pack_verify_step
from compiled_engine.step import PaddingSequence, pack_step
from ops.step import StepInputs
from ops.library import NULL_SLOT

logger = logging.getLogger(__name__)

CPU_KV_CACHE_BYTES = 1 << 30  # default KV budget on CPU, where no device memory can be measured

# Prefill steps run at start-up after the largest one, for their shapes, not their memory: Triton compiles a kernel
# variant per class of each integer argument (1, a multiple of 16, anything else), and FLA's delta-rule kernels take
# the step's token and sequence counts, so a class first met while serving would compile in the middle of it. These
# lengths give one sequence and several, token totals that are multiples of 16 and totals that are not; they are
# short steps, which take the delta rule's recurrent form, so ``chunked_warmup_lengths`` adds the chunked form's.
WARMUP_PREFILL_LENGTHS = ([17], [17, 20], [16, 16])
# FLA's l2norm kernel (q and k of every linear-attention layer) autotunes per bucket NB = cdiv(rows, 65536) of its
# rows, rows = tokens x key heads (fla/modules/norm/l2norm.py, fla-core 0.6). A bucket first met while serving
# costs that step ~10 s of Triton compiles and timed launches, so start-up runs one prefill in every bucket.
FLA_L2NORM_BUCKET_ROWS = 65536


def default_max_num_batched_tokens(device: torch.device) -> int:
    """vLLM's default token budget of a prefill step for offline use (its ``LLM`` class): 16,384 on a GPU of 70 GiB
    or more, 8,192 elsewhere (CPU included). bench/NOTES.md, "Prefill budget", has the measurement."""
    if device.type == "cuda" and torch.cuda.get_device_properties(device).total_memory >= 70 * 2**30:
        return 16384
    return 8192


def largest_prefill_lengths(max_num_batched_tokens: int, max_model_len: int, max_num_seqs: int) -> list[int]:
    """Sequence lengths of the largest prefill step the scheduler can build: ``max_num_batched_tokens`` tokens in
    all (fewer only if ``max_num_seqs`` full-length sequences hold fewer), no sequence over ``max_model_len``.

    The start-up step must be this large, not one sequence of at most ``max_model_len``: FLA tunes its l2norm kernel
    per bucket of the step's token count (a cold tune inside the first served step costs it seconds), and the
    activation peak of the memory plan would be undercounted.
    """
    total = min(max_num_batched_tokens, max_model_len * max_num_seqs)
    full, rest = divmod(total, max_model_len)
    return [max_model_len] * full + ([rest] if rest else [])


def chunked_warmup_lengths(max_num_batched_tokens: int, max_model_len: int, max_num_seqs: int,
                           recurrent_max_tokens: int) -> list[list[int]]:
    """Start-up steps for the chunked delta rule's variants that the largest steps (totals that are multiples of 16)
    leave out: a total just past ``recurrent_max_tokens`` (the op's short-step limit: ops/triton/
    delta_rule_kernels.py), not a multiple of 16, as one sequence or as few as ``max_model_len`` allows. None where
    no served step can be that large."""
    total = max(recurrent_max_tokens + 1, 2)  # past the limit, neither 1 nor a multiple of 16
    total += total % 16 == 0
    if total > min(max_num_batched_tokens, max_model_len * max_num_seqs):
        return []
    return [largest_prefill_lengths(total, max_model_len, max_num_seqs)]


def l2norm_bucket_totals(largest_total: int, key_heads: int) -> list[int]:
    """A token total in each of FLA's l2norm buckets below the largest step's (``FLA_L2NORM_BUCKET_ROWS``): the top
    of each, ``b`` buckets' worth of rows. ``key_heads``: linear-attention key heads on this rank."""
    per_bucket = max(1, FLA_L2NORM_BUCKET_ROWS // key_heads)
    largest_bucket = math.ceil(largest_total * key_heads / FLA_L2NORM_BUCKET_ROWS)
    return [b * per_bucket for b in range(1, largest_bucket)]


def allocate_caches(
    model: HybridModel,
    config: RuntimeConfig,
    max_model_len: int,
    device: torch.device,
    dtype: torch.dtype,
    snapshot_mirror: Callable[[str, int, int], None] | None = None,
    captured_prefill_tokens: int = 0,
    captured_prefill_seqs: int = 1,
) -> tuple[CacheConfig, PrefixCache | None]:
    """Allocate this rank's caches as buffers of the model's layers (state pools, KV cache) and the prefix cache's
    snapshot pool; returns the sizes settled on and the prefix cache (None when prefix caching is off).
    ``captured_prefill_tokens`` / ``captured_prefill_seqs``: the largest prompt step the runtime will capture (0
    tokens: none), whose graphs' memory pool and logits buffer the plan leaves room for.

    Every tensor-parallel rank calls this with the same config; the KV plan takes the smallest rank's.
    ``snapshot_mirror``: rank 0's prefix cache repeats each snapshot copy on the other ranks through it.
    """
    if config.state_dtype is None and model.config.mamba_ssm_dtype == "float16":
        logger.warning("the checkpoint asks for a float16 recurrent state (mamba_ssm_dtype); its pool is float32")
    config = config.for_model(model.config)
    num_slots = config.max_num_seqs + 1  # + the null slot
    allocate_state_pools(model, num_slots, device, dtype, config.state_dtype)
    if config.speculative_config is not None:  # a verify step's per-position states, before the KV plan too
        allocate_verify_history(model, config.speculative_config.num_speculative_tokens, config.max_num_seqs)
    prefix_cache = None
    if config.enable_prefix_caching:  # its snapshot pool is allocated before the KV plan takes the rest
        prefix_cache = PrefixCache(
            model, config.block_size, config.prefix_snapshot_interval, config.num_prefix_snapshots,
            device, dtype, config.state_dtype, mirror=snapshot_mirror,
        )
    num_kv_blocks = config.num_kv_blocks or plan_kv_blocks(model, config, max_model_len, device, dtype,
                                                           captured_prefill_tokens, captured_prefill_seqs)
    blocks_for_one = math.ceil(max_model_len / config.block_size)
    if blocks_for_one > num_kv_blocks - 1:
        raise ValueError(
            f"one max_model_len={max_model_len} sequence needs {blocks_for_one} KV blocks but only "
            f"{num_kv_blocks - 1} fit: lower max_model_len or raise num_kv_blocks / gpu_memory_utilization"
        )
    allocate_kv_cache(model, num_kv_blocks, config.block_size, device, dtype)
    logger.info(
        "KV cache: %d blocks of %d tokens (%d tokens); %d state slots (%s recurrent state); concurrency limit %d "
        "sequences of max_model_len=%d",
        num_kv_blocks - 1, config.block_size, (num_kv_blocks - 1) * config.block_size, config.max_num_seqs,
        str(config.state_dtype).removeprefix("torch."),
        min(config.max_num_seqs, (num_kv_blocks - 1) // blocks_for_one), max_model_len,
    )
    return CacheConfig(config.block_size, num_kv_blocks, num_slots, config.state_dtype), prefix_cache


def plan_kv_blocks(
    model: HybridModel, config: RuntimeConfig, max_model_len: int, device: torch.device, dtype: torch.dtype,
    captured_prefill_tokens: int = 0, captured_prefill_seqs: int = 1,
) -> int:
    """KV blocks from the memory left after weights, state pools and the measured activation peak (with the captured
    prompt steps' pool: ``measure_activation_peak``).

    On CUDA: run the largest prefill step and the largest decode step on throwaway caches, measure the peak,
    and give KV blocks what ``gpu_memory_utilization`` leaves. On CPU: a fixed budget (CPU_KV_CACHE_BYTES).
    """
    block_bytes = kv_bytes_per_block(model, config.block_size, dtype)
    wanted = config.max_num_seqs * math.ceil(max_model_len / config.block_size) + 1
    if block_bytes == 0:  # no attention layer: blocks cost nothing, so give every sequence its full length
        return wanted
    if device.type != "cuda":
        return max(2, min(wanted, CPU_KV_CACHE_BYTES // block_bytes))
    start = time.perf_counter()
    peak = measure_activation_peak(model, config, max_model_len, device, dtype, captured_prefill_tokens,
                                   captured_prefill_seqs)
    seconds = time.perf_counter() - start  # on an empty cache, mostly the prompt path's compiles and FLA's tuning
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    budget = total * config.gpu_memory_utilization - (total - free) - peak
    blocks = int(budget // block_bytes)
    if model.tp.world_size > 1:  # every rank must have the same blocks: take the smallest plan
        agreed = torch.tensor([blocks], device=device)
        torch.distributed.all_reduce(agreed, op=torch.distributed.ReduceOp.MIN)
        blocks = int(agreed.item())
    logger.info(
        "memory plan: %.2f GiB in use (weights, state pools), activation peak %.2f GiB (its steps ran in %.1f s), "
        "%.2f GiB for KV", (total - free) / 2**30, peak / 2**30, seconds, max(budget, 0) / 2**30,
    )
    return max(2, min(wanted, blocks))


def _padding_step(lengths: list[int], is_prefill: bool, block_size: int, device: torch.device) -> StepInputs:
    """A step of padding sequences of these lengths (every token on the null block, every sequence on the null
    slot), packed by ``pack_step`` as served steps are."""
    seqs = [PaddingSequence(n, block_size) for n in lengths]
    return pack_step(seqs, lengths if is_prefill else [1] * len(seqs), is_prefill, block_size, device)


@torch.inference_mode()
def measure_activation_peak(
    model: HybridModel, config: RuntimeConfig, max_model_len: int, device: torch.device, dtype: torch.dtype,
    captured_prefill_tokens: int = 0, captured_prefill_seqs: int = 1,
) -> int:
    """Peak bytes of the largest prefill (max_num_batched_tokens tokens) and decode (max_num_seqs) steps (and
    verify steps of max_num_seqs sequences with speculative decoding), plus, with ``captured_prefill_tokens``, the
    peak of a prompt step of that many tokens in ``captured_prefill_seqs`` sequences and a padding one alone (and its
    MTP pass, with speculative decoding) and the graphs' logits buffer: the captured prompt steps' memory pool
    (graphs/prefill_graph.py) holds them for good, apart from what eager steps allocate.

    The steps run on a 2-block KV cache with every token routed to the null block and every sequence to the
    null slot: the numbers are garbage, the memory traffic and allocation pattern are real. They are packed by
    ``pack_step``, as served steps are, and smaller prefills follow the largest one, for the kernel variants and
    autotuning buckets they meet: see ``FLA_L2NORM_BUCKET_ROWS`` and ``WARMUP_PREFILL_LENGTHS``.
    """
    block_size = config.block_size
    allocate_kv_cache(model, 2, block_size, device, dtype)
    largest = largest_prefill_lengths(config.max_num_batched_tokens, max_model_len, config.max_num_seqs)
    halves = [n for piece in largest for n in (piece // 2, piece - piece // 2) if n]  # more sequences, same total
    key_heads = next((m.num_k_heads for m in model.modules() if isinstance(m, GatedDeltaNet)), None)
    totals = l2norm_bucket_totals(sum(largest), key_heads) if key_heads else []
    buckets = [largest_prefill_lengths(total, max_model_len, config.max_num_seqs) for total in totals]
    from ops.triton.delta_rule_kernels import RECURRENT_PREFILL_MAX_TOKENS  # CUDA only, as this function

    chunked = chunked_warmup_lengths(config.max_num_batched_tokens, max_model_len, config.max_num_seqs,
                                     RECURRENT_PREFILL_MAX_TOKENS)

    def step(lengths: list[int], is_prefill: bool) -> StepInputs:
        return _padding_step(lengths, is_prefill, block_size, device)

    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    baseline = torch.cuda.memory_allocated(device)
    for lengths in (largest, halves, *buckets, *chunked, *WARMUP_PREFILL_LENGTHS):
        prefill = step(lengths, True)
        model.compute_logits(model(prefill)[prefill.last_token_indices()])
    decode = step([1] * config.max_num_seqs, False)
    model.compute_logits(model(decode))
    if config.speculative_config is not None:  # a verify step of every sequence: k + 1 rows each, all with logits
        k = config.speculative_config.num_speculative_tokens
        verify = pack_verify_step([], [], block_size, device, pad_to=config.max_num_seqs, num_drafts=k)
        model.compute_logits(model(verify))
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - baseline
    if captured_prefill_tokens:  # as PrefillGraphs captures its largest key, plus its logits buffer
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)
        half = captured_prefill_tokens // 2
        captured = step([half] + [0] * (captured_prefill_seqs - 1) + [captured_prefill_tokens - half], True)
        hidden = model(captured)
        logits = model.compute_logits(hidden[captured.last_token_indices()])
        logits_buffer = torch.empty_like(logits)  # PrefillGraphs.logits, held beside the pool
        if config.speculative_config is not None:  # the drafts' graph: the MTP layer over the step's rows
            model.mtp_forward(captured.input_ids, hidden, captured)
        torch.cuda.synchronize(device)
        peak += torch.cuda.max_memory_allocated(device) - baseline
        del logits, logits_buffer
    reset_state_slot(model, NULL_SLOT)
    return peak
