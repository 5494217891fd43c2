"""Argument layouts that an op's reference (ops/<family>.py) and its kernel (ops/triton/<family>_kernels.py) share.

Below both: op modules import kernel modules, never the reverse (ops/triton/__init__.py), so what both need lives
here, in plain Python (no triton: the references run where triton is absent). It imports nothing from ops.

* ``ce::attention_decode``'s ``projected`` row: ``[q_gate (Hq*2*D) | k (Hkv*D) | v (Hkv*D)]``;
* ``ce::gated_deltanet_decode``'s ``projected`` row: ``[q (Hk*K) | k (Hk*K) | v (Hv*V) | z (Hv*V) | b (Hv) | a (Hv)]``;
* ``ce::gated_deltanet_verify``'s history entry (what ``ce::gated_deltanet_commit`` replays);
* FLA's chunk length, which the chunked delta-rule reference, the host chunk table and FLA's kernels all use;
* ``ce::sample``'s number formats: the integer key of a logit, the fixed-point token mass, the cut-offs;
* ``ce::fused_moe``'s block-aligned order of (token, expert) rows (``moe_align_block_size``).
* a verify step's ``cu_seqlens`` (``verify_cu_seqlens``: ``ce::paged_attention_verify`` and the compiled rounds).
"""

from __future__ import annotations

import torch

CHUNK_SIZE = 64  # FLA's chunk length; prefix-cache snapshot boundaries are multiples of it


def attention_decode_split_sizes(num_heads: int, num_kv_heads: int, head_dim: int) -> list[int]:
    """Widths of ``ce::attention_decode``'s ``projected`` blocks ``[q_gate | k | v]``."""
    return [2 * num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]


def check_attention_decode_args(projected, inv_freq, k_cache, num_heads, num_kv_heads, head_dim) -> None:
    """``ce::attention_decode``'s argument checks, shared by the reference and the kernel."""
    width = sum(attention_decode_split_sizes(num_heads, num_kv_heads, head_dim))
    if projected.dim() != 2 or projected.shape[1] != width:
        raise ValueError(f"attention_decode: projected must be [B, {width}] ([q_gate | k | v]), "
                         f"got {tuple(projected.shape)}")
    if num_heads % num_kv_heads:
        raise ValueError(f"attention_decode: {num_heads=} is not a multiple of {num_kv_heads=}")
    if inv_freq.dim() != 1 or not 0 < 2 * inv_freq.shape[0] <= head_dim:
        raise ValueError(f"attention_decode: inv_freq must be [rotary_dim / 2] with rotary_dim <= {head_dim=}, "
                         f"got {tuple(inv_freq.shape)}")
    if k_cache.dim() != 4 or tuple(k_cache.shape[2:]) != (num_kv_heads, head_dim):
        raise ValueError(f"attention_decode: the caches must be [num_blocks, block_size, {num_kv_heads}, {head_dim}], "
                         f"got {tuple(k_cache.shape)}")


def gated_deltanet_split_sizes(num_k_heads: int, head_k_dim: int, num_v_heads: int,
                               head_v_dim: int) -> list[int]:
    """Widths of ``ce::gated_deltanet_decode``'s ``projected`` blocks ``[q | k | v | z | b | a]``."""
    key_dim, value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
    return [key_dim, key_dim, value_dim, value_dim, num_v_heads, num_v_heads]


def check_gated_deltanet_decode_args(projected, conv_weight, num_k_heads, head_k_dim, num_v_heads,
                                     head_v_dim) -> None:
    """``ce::gated_deltanet_decode``'s argument checks, shared by the reference and the kernel."""
    sizes = gated_deltanet_split_sizes(num_k_heads, head_k_dim, num_v_heads, head_v_dim)
    if projected.dim() != 2 or projected.shape[1] != sum(sizes):
        raise ValueError(f"gated_deltanet_decode: projected must be [B, {sum(sizes)}] ([q | k | v | z | b | a]), "
                         f"got {tuple(projected.shape)}")
    if num_v_heads % num_k_heads:
        raise ValueError(f"gated_deltanet_decode: {num_v_heads=} is not a multiple of {num_k_heads=}")
    if conv_weight.dim() != 2 or conv_weight.shape[0] != sum(sizes[:3]):
        raise ValueError(f"gated_deltanet_decode: conv_weight must be [{sum(sizes[:3])}, W], "
                         f"got {tuple(conv_weight.shape)}")


def gated_deltanet_history_offsets(num_k_heads: int, head_k_dim: int, num_v_heads: int,
                                   head_v_dim: int) -> tuple[int, int, int, int]:
    """``ce::gated_deltanet_verify``'s history entry of one (sequence, position), fp32: ``[x (C) | keys (Hk*K) |
    updates (Hv*V) | decays (Hv)]``: the q|k|v conv inputs as the conv state holds them, the l2-normalised keys, the
    delta rule's ``u = (v - S^T k) * beta`` and ``exp(g)`` of each value head. Returns the offsets of keys, updates
    and decays, and the entry's width."""
    key_dim, value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
    keys = 2 * key_dim + value_dim
    updates = keys + key_dim
    decays = updates + value_dim
    return keys, updates, decays, decays + num_v_heads


def check_gated_deltanet_verify_args(projected, conv_weight, state_slots, history, num_k_heads, head_k_dim,
                                     num_v_heads, head_v_dim) -> int:
    """The verify op's argument checks (the decode op's, and the history's shape); returns P."""
    check_gated_deltanet_decode_args(projected, conv_weight, num_k_heads, head_k_dim, num_v_heads, head_v_dim)
    n = state_slots.shape[0]
    width = gated_deltanet_history_offsets(num_k_heads, head_k_dim, num_v_heads, head_v_dim)[3]
    if n == 0 or projected.shape[0] % n:
        raise ValueError(f"gated_deltanet_verify: {projected.shape[0]} rows are not P rows for each of {n} sequences")
    positions = projected.shape[0] // n
    if (history.dim() != 3 or history.dtype != torch.float32 or history.shape[0] < n
            or history.shape[1] < positions or history.shape[2] != width):
        raise ValueError(f"gated_deltanet_verify: history must be fp32 [>= {n}, >= {positions}, {width}], got "
                         f"{history.dtype} {tuple(history.shape)}")
    return positions


# ce::paged_attention_verify (ops/paged_attention.py) and the compiled rounds (compiled_engine/speculative.py)
def verify_cu_seqlens(num_seqs: int, rows_per_seq: int, device: torch.device) -> torch.Tensor:
    """A verify step's ``cu_seqlens`` ``[N + 1]`` int32: ``rows_per_seq`` rows for every sequence."""
    return torch.arange(0, (num_seqs + 1) * rows_per_seq, rows_per_seq, dtype=torch.int32, device=device)


# ce::sample (ops/sample.py)
KEY_SHIFT = {torch.float32: 0, torch.float16: 13, torch.bfloat16: 16}  # low key bits that are constant per dtype
MIN_TEMPERATURE = 2.0**-100  # temperatures below it count as it: 1 / T stays finite
MASS_SCALE = 2.0**32  # W = trunc(exp_ce(y) * 2**32): the fixed-point weight of a token in the top-p masses
EXP_CUTOFF = -80.0  # exp_ce(y) = 0 below it


# ce::fused_moe (ops/moe.py)
def moe_padded_rows(num_rows, num_experts: int, block_m: int):
    """The static length of ``moe_align_block_size``'s ``sorted_rows``: ``num_rows`` routed rows (T x k), each
    expert that gets any padded up to a multiple of ``block_m``, rounded up to whole blocks. At most
    ``min(E, num_rows)`` experts get a row, each wasting at most ``block_m - 1`` slots. Works on SymInts (a compiled
    graph's symbolic batch), so it never guards on the batch size."""
    bound = num_rows + torch.sym_min(num_experts, num_rows) * (block_m - 1)
    return (bound + block_m - 1) // block_m * block_m


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """Sort the routed rows ``r = t * k + j`` (token t's j-th expert) by expert into blocks of ``block_m`` rows that
    all belong to one expert: the layout the grouped GEMM of ``ce::fused_moe`` walks, one block per program.

    Returns ``sorted_rows`` int32 ``[moe_padded_rows(T*k, E, block_m)]`` (expert 0's rows in row order, padded with
    the sentinel ``T*k`` to a multiple of ``block_m``, then expert 1's...; the tail past ``num_padded`` is all
    sentinel), ``block_experts`` int32 ``[len(sorted_rows) / block_m]`` (each block's expert; blocks past
    ``num_padded`` hold expert E - 1 and are skipped by the kernel) and ``num_padded`` int32 ``[1]``. Experts
    without rows get no block. Static shapes and no host sync: the decode step's CUDA graph can hold it.
    """
    flat = topk_ids.reshape(-1).long()
    n = flat.numel()
    counts = torch.zeros(num_experts, dtype=torch.long, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)  # rows grouped by expert, each group in row order
    expert_of = flat[order]
    first_of_expert = counts.cumsum(0) - counts
    rank = torch.arange(n, device=flat.device) - first_of_expert[expert_of]
    length = moe_padded_rows(n, num_experts, block_m)
    sorted_rows = torch.full((length,), n, dtype=torch.int32, device=flat.device)
    sorted_rows[(ends - padded)[expert_of] + rank] = order.to(torch.int32)
    block_starts = torch.arange(0, length, block_m, device=flat.device)
    block_experts = torch.searchsorted(ends, block_starts, right=True).clamp_(max=num_experts - 1).to(torch.int32)
    return sorted_rows, block_experts, ends[-1:].to(torch.int32)
