"""Triton kernel for ``ce::attention_decode``: a full-attention layer's decode step between qkv_proj and o_proj.

Why: at decode batch 1 the unfused path launches ~7 small kernels per attention layer (q_norm, k_norm, rotary,
store_kv, the paged attention split and reduce kernels, the sigmoid gate), each mostly launch and dependency
latency. This is one kernel (plus the paged decode's reduce kernel when the context is split), reading q, gate, k
and v straight from the qkv_proj output row by offset (no split copies) and writing the gated output o_proj reads.

Grid ``(B, Hkv, NUM_SPLITS)``, as the paged decode kernel (ops/triton/paged_attention_kernels.py, whose tile loads,
online-softmax step, split count, partials and reduce kernel this reuses). Program (b, h, s):
  * zero-centred RMSNorm and NeoX RoPE of the ``G = Hq / Hkv`` query heads of KV head h, in fp32 with the
    reference's roundings (normalised q in the model dtype; cos, sin, both products and their sum in it). Rotate-half
    pairs channel d with ``d +- rotary_dim / 2``: the program loads each row a second time at the partner channels
    (cache hits) and normalises both copies the same way, instead of permuting registers;
  * attention over the CACHED positions ``[0, context_len - 1)``, split s taking its slice of that range;
  * the last split (``s == NUM_SPLITS - 1``) also owns the new token at position ``context_len - 1``: it normalises
    and rotates k, stores k and v at ``slot_mapping[b]`` (the only program that writes the cache), and folds the new
    token into its softmax from registers, rounded to the cache dtype first, i.e. exactly what the reference reads
    back from the cache. No program reads a row another program of the launch writes, so there is no ordering to
    enforce. The owner does at most one token more than the others: no imbalance worth a smarter choice;
  * one split: normalise, multiply by ``sigmoid(gate)`` and store ``[B, Hq*D]``; more: store the partials, which
    the reduce kernel (launched with PDL, a program per query head and slice of its channels: ``reduce_parts``)
    merges and gates. (Merging in the last split program of each group instead, behind an atomic counter, was
    measured slower: bench/NOTES.md, "Removed alternatives".)
A padding lane (context_len 0) attends to nothing and writes zeros; its owner still stores k and v, into the null
block its slot points at (padding lanes race there by design; nobody reads it).

PDL (ops/triton/pdl.py): the norm weights and inv_freq are loaded before ``gdc_wait``; at small batches
(``EARLY_LOADS``) so are the step's inputs (context length, position, cache slot, block table) and the split's first
key and value tile: nothing in the step writes them before this kernel (the new token's row, which this kernel writes,
is not in any split's cached slice), and there qkv_proj is the skinny GEMM, which launches this kernel early. The
projected row is read after the wait (the query's, and the owner's k and v, all before the first norm's reduction).
The next kernel (the reduce kernel, or o_proj's skinny GEMM) can start while this kernel still runs.

The query tile has ``GROUP_P`` rows: G rounded up to a power of two, not to the mma's 16 (Triton pads a ``tl.dot``'s
M side itself), so the query's norm and RoPE, which run on every row of the tile, compute G rows' worth at the
Qwen3.5-0.8B shape (G = 4) instead of 16 (``query_rows`` overrides it, for the bench).

Registers (the Qwen3.5-0.8B shapes: G = 4, D = 256, rotary_dim 64, bf16, 64-token tiles): the q tile and its partner
copy are ``[GROUP_P, 256]`` fp32 and dead before the key loop, which holds what the paged decode kernel holds (q as the
``tl.dot`` operand, a ``[64, 256]`` K and V tile, the ``[GROUP_P, 256]`` accumulator); with ``EARLY_LOADS`` the first K
and V tile are live through the query's norm and RoPE as well. ``tl.cos``/``tl.sin``
compile to libdevice's ``__nv_cosf``/``__nv_sinf`` (full range reduction, as torch's), not the approximate instructions:
positions reach ~1e5 and ``inv_freq[0]`` is 1.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ops.layouts import check_attention_decode_args
from ops.triton import unit_stride
from ops.triton.paged_attention_kernels import (
    LOG2E,
    NEG_BIG,
    _attend_range,
    _attend_tile,
    _dot_fp32,
    _kv_blocks,
    _load_kv_rows,
    _sigmoid_gated,
    _store_partials,
    _tile_n,
    decode_num_splits,
    reduce_splits,
)
from ops.triton.pdl import pdl_flags


# Batches whose step inputs and first key tile are read before the PDL wait. That pays only where the kernel before,
# qkv_proj, launches this one early: the skinny GEMM does (up to ops/linear.py's SKINNY_MAX_ROWS rows); cuBLAS
# does not, and there the first tile held in registers through the query's norm and RoPE made the step slower
# (bench/NOTES.md, "Runs 117-120").
EARLY_LOADS_MAX_BATCH = 4

# The split kernel's pipeline stages by batch: (most sequences, stages), None for Triton's default (3). Up to 4
# sequences a program walks 1-4 key tiles, the first read before the PDL wait; the loop's cp.async stages only delay
# them (1 stage: -2 to -3 µs a call, the decode graph -9 to -50 µs a step at batch 1-4; from 8 sequences the default
# leads). The paged decode of a verify's rows keeps the default: there 1 stage lost, at a short context and at 8,192
# tokens (bench/NOTES.md, "Runs 237-239", "Fifty-third session").
DECODE_STAGES: tuple[tuple[float, int | None], ...] = ((4, 1), (math.inf, None))


def decode_stages(batch: int) -> int | None:
    """The split kernel's ``num_stages`` for ``batch`` sequences (``DECODE_STAGES``)."""
    return next(stages for most, stages in DECODE_STAGES if batch <= most)


@triton.jit
def _norm_rope_loads(row, offs, rows_mask, offs_d, d_mask, partner, rot_mask, stride_c):
    """The loads behind :func:`_norm_rope_values` of the rows starting at ``row + offs * stride_c`` ([R] element
    offsets): each row's channels and its rotary channels' partners. Apart from the math, so that a kernel issues
    every row's loads before the first row's reduction."""
    starts = row + offs[:, None] * stride_c
    x = tl.load(starts + offs_d[None, :] * stride_c, mask=rows_mask[:, None] & d_mask[None, :], other=0.0)
    # The partner channel of each rotary channel, normalised by the same arithmetic: bitwise the value x_n[partner].
    xp = tl.load(starts + partner[None, :] * stride_c, mask=rows_mask[:, None] & rot_mask[None, :], other=0.0)
    return x, xp


@triton.jit
def _norm_rope_values(x, xp, w, w_partner, cos, sin, eps, offs_d, rot_mask, HEAD_DIM: tl.constexpr,
                      ROTARY_HALF: tl.constexpr, dtype: tl.constexpr):
    """Zero-centred RMSNorm over D, then NeoX RoPE on the first ``2 * ROTARY_HALF`` channels, of rows loaded by
    :func:`_norm_rope_loads` -> [R, HEAD_DIM_P] in ``dtype``, rounded as ``rms_norm_reference`` then
    ``rotary_reference`` round (``cos``/``sin`` already in ``dtype``)."""
    x = x.to(tl.float32)
    xp = xp.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, 1) / HEAD_DIM + eps)[:, None]
    xn = (x * rstd * (1.0 + w[None, :])).to(dtype).to(tl.float32)
    xpn = (xp * rstd * (1.0 + w_partner[None, :])).to(dtype).to(tl.float32)
    rotated_half = tl.where(offs_d < ROTARY_HALF, -1.0, 1.0)[None, :] * xpn  # [-x2 | x1]
    rotated = (xn * cos[None, :]).to(dtype).to(tl.float32) + (rotated_half * sin[None, :]).to(dtype).to(tl.float32)
    return tl.where(rot_mask[None, :], rotated, xn).to(dtype)


@triton.jit
def _rope_lanes(HEAD_DIM: tl.constexpr, HEAD_DIM_P: tl.constexpr, ROTARY_HALF: tl.constexpr):
    """A head's channel lanes: their offsets, which are real channels (< D), which are rotated, and each rotated
    lane's rotate-half partner (d +- rotary_dim / 2)."""
    offs_d = tl.arange(0, HEAD_DIM_P)
    partner = tl.where(offs_d < ROTARY_HALF, offs_d + ROTARY_HALF, offs_d - ROTARY_HALF)
    return offs_d, offs_d < HEAD_DIM, offs_d < 2 * ROTARY_HALF, partner


@triton.jit
def _norm_weights(weight, offs_d, d_mask, partner, rot_mask):
    """A q/k norm's weight at each lane and at its partner lane, fp32 (``_norm_rope_values``' w, w_partner)."""
    return (tl.load(weight + offs_d, mask=d_mask, other=0.0).to(tl.float32),
            tl.load(weight + partner, mask=rot_mask, other=0.0).to(tl.float32))


@triton.jit
def _cos_sin(position, freq, dtype: tl.constexpr):
    """RoPE's cos and sin at ``position`` for the lanes' frequencies, rounded to ``dtype`` as the reference casts
    them."""
    angle = position.to(tl.float32) * freq
    return tl.cos(angle).to(dtype).to(tl.float32), tl.sin(angle).to(dtype).to(tl.float32)


@triton.jit
def _store_kv_row(k_cache, v_cache, slot, kv_head, k, v, offs_d, d_mask, stride_k_block, stride_k_offset,
                  stride_k_head, stride_k_dim, stride_v_block, stride_v_offset, stride_v_head, stride_v_dim,
                  BLOCK_SIZE: tl.constexpr):
    """One token's k and v ``[1, HEAD_DIM_P]`` of KV head ``kv_head`` into the paged caches at flat row ``slot``."""
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    tl.store(k_cache + block * stride_k_block + offset * stride_k_offset + kv_head * stride_k_head
             + offs_d[None, :] * stride_k_dim, k.to(k_cache.dtype.element_ty), mask=d_mask[None, :])
    tl.store(v_cache + block * stride_v_block + offset * stride_v_offset + kv_head * stride_v_head
             + offs_d[None, :] * stride_v_dim, v.to(v_cache.dtype.element_ty), mask=d_mask[None, :])


@triton.jit
def _attention_decode_kernel(
    projected,
    q_norm_weight,
    k_norm_weight,
    inv_freq,
    positions,
    k_cache,
    v_cache,
    slot_mapping,
    block_tables,
    context_lens,
    out,  # contiguous [B, Hq * D]
    part_acc,  # [B, Hq, NUM_SPLITS, D] fp32 (unused when NUM_SPLITS == 1)
    part_max,  # [B, Hq, NUM_SPLITS] fp32
    part_sum,  # [B, Hq, NUM_SPLITS] fp32
    eps,
    scale_log2,
    stride_p_b,
    stride_p_c,
    stride_k_block,
    stride_k_offset,
    stride_k_head,
    stride_k_dim,
    stride_v_block,
    stride_v_offset,
    stride_v_head,
    stride_v_dim,
    stride_bt_b,
    stride_bt_n,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_P: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    ROTARY_HALF: tl.constexpr,  # len(inv_freq): channels [0, 2 * ROTARY_HALF) are rotated
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_FP32: tl.constexpr,
    USE_PDL: tl.constexpr,  # ops/triton/pdl.py
    EARLY_LOADS: tl.constexpr,  # the step's inputs and the first key tile read before the PDL wait
):
    K_START = 2 * NUM_Q_HEADS * HEAD_DIM  # [q_gate | k | v]
    V_START = K_START + NUM_KV_HEADS * HEAD_DIM

    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
    offs_d, d_mask, rot_mask, partner = _rope_lanes(HEAD_DIM, HEAD_DIM_P, ROTARY_HALF)
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    dtype = out.dtype.element_ty
    row = projected + seq * stride_p_b
    bt_row = block_tables + seq * stride_bt_b
    # Weights (constant during a step): read before the wait.
    q_w, q_w_partner = _norm_weights(q_norm_weight, offs_d, d_mask, partner, rot_mask)
    k_w, k_w_partner = _norm_weights(k_norm_weight, offs_d, d_mask, partner, rot_mask)
    freq = tl.load(inv_freq + offs_d % ROTARY_HALF, mask=rot_mask, other=0.0)  # emb = cat(freqs, freqs)
    if not EARLY_LOADS:
        if USE_PDL:
            tl.extra.cuda.gdc_wait()  # qkv_proj's output, the step inputs and the caches are read after this
    # The step's inputs (context length, position, cache slot, block table) and the keys and values of the cached
    # positions are written before the step (host copies, the previous step's graph and attention) and by no kernel
    # of the step before this one: with EARLY_LOADS they are read before the wait, while qkv_proj still runs.
    context_len = tl.load(context_lens + seq)
    cos, sin = _cos_sin(tl.load(positions + seq), freq, dtype)
    slot = tl.load(slot_mapping + seq).to(tl.int64)  # where the new token's k and v go
    # This split's slice of the cached context (the new token excluded), a whole number of tiles.
    cached = tl.maximum(context_len - 1, 0)
    per_split = tl.cdiv(tl.cdiv(cached, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, cached)
    if EARLY_LOADS:  # the slice's first tile, folded in after the query is ready
        offs_n0 = start + tl.arange(0, BLOCK_N)
        n_mask0 = offs_n0 < end
        blocks0 = _kv_blocks(bt_row, stride_bt_n, offs_n0, n_mask0, BLOCK_SIZE)
        k0 = _load_kv_rows(k_cache, blocks0, offs_n0, n_mask0, kv_head, offs_d, d_mask, stride_k_block,
                           stride_k_offset, stride_k_head, stride_k_dim, BLOCK_SIZE)
        v0 = _load_kv_rows(v_cache, blocks0, offs_n0, n_mask0, kv_head, offs_d, d_mask, stride_v_block,
                           stride_v_offset, stride_v_head, stride_v_dim, BLOCK_SIZE)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()  # qkv_proj's output is read after this

    offs_g = tl.arange(0, GROUP_P)
    g_mask = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    # Every load of the projected row at once: the query heads', and for the new token's owner its k and v (masked
    # off elsewhere), which would otherwise each wait for the reduction before them.
    owner = split == NUM_SPLITS - 1
    one_row = tl.arange(0, 1)  # k and v as [1, HEAD_DIM_P] rows, broadcasting against the q rows
    owner_row = one_row + split == NUM_SPLITS - 1  # [1]: owner as a mask (a scalar's would do, but not interpreted)
    q_x, q_xp = _norm_rope_loads(row, heads * (2 * HEAD_DIM), g_mask, offs_d, d_mask, partner, rot_mask, stride_p_c)
    k_x, k_xp = _norm_rope_loads(row, K_START + kv_head * HEAD_DIM + one_row, owner_row, offs_d, d_mask, partner,
                                 rot_mask, stride_p_c)
    v_new = tl.load(row + (V_START + kv_head * HEAD_DIM + offs_d[None, :]) * stride_p_c,
                    mask=owner_row[:, None] & d_mask[None, :], other=0.0).to(v_cache.dtype.element_ty)
    q = _norm_rope_values(q_x, q_xp, q_w, q_w_partner, cos, sin, eps, offs_d, rot_mask, HEAD_DIM, ROTARY_HALF, dtype)
    if DOT_FP32:
        q = q.to(tl.float32)
    else:
        q = q.to(k_cache.dtype.element_ty)

    m_i = tl.full([GROUP_P], NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([GROUP_P], dtype=tl.float32)
    acc = tl.zeros([GROUP_P, HEAD_DIM_P], dtype=tl.float32)

    if owner:  # the owner of the new token
        k_new = _norm_rope_values(k_x, k_xp, k_w, k_w_partner, cos, sin, eps, offs_d, rot_mask, HEAD_DIM, ROTARY_HALF,
                                  dtype)
        k_new = k_new.to(k_cache.dtype.element_ty)
        _store_kv_row(k_cache, v_cache, slot, kv_head, k_new, v_new, offs_d, d_mask, stride_k_block, stride_k_offset,
                      stride_k_head, stride_k_dim, stride_v_block, stride_v_offset, stride_v_head, stride_v_dim,
                      BLOCK_SIZE)
        if context_len > 0:
            # The first key this program sees: the running max is its score, the sum exp2(0) = 1, acc its value.
            m_i = tl.sum(q.to(tl.float32) * k_new.to(tl.float32), 1) * scale_log2
            l_i = tl.full([GROUP_P], 1.0, dtype=tl.float32)
            acc = acc + v_new.to(tl.float32)

    first = start
    if EARLY_LOADS:
        if start < end:
            m_i, l_i, acc = _attend_tile(q, k0, v0, n_mask0[None, :], m_i, l_i, acc, scale_log2, DOT_FP32)
        first = start + BLOCK_N
    m_i, l_i, acc = _attend_range(q, k_cache, v_cache, bt_row, stride_bt_n, first, end, kv_head, offs_d, d_mask,
                                  stride_k_block, stride_k_offset, stride_k_head, stride_k_dim, stride_v_block,
                                  stride_v_offset, stride_v_head, stride_v_dim, m_i, l_i, acc, scale_log2, m_i,
                                  BLOCK_SIZE, BLOCK_N, DOT_FP32, False)  # no query positions

    if NUM_SPLITS == 1:
        # l_i == 0 only for a padding lane, whose acc is 0: zeros, not 0/0, times the gate.
        attn = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        mask = g_mask[:, None] & d_mask[None, :]
        gate = tl.load(row + (heads[:, None] * (2 * HEAD_DIM) + HEAD_DIM + offs_d[None, :]) * stride_p_c, mask=mask,
                       other=0.0)
        tl.store(out + seq * (NUM_Q_HEADS * HEAD_DIM) + heads[:, None] * HEAD_DIM + offs_d[None, :],
                 _sigmoid_gated(attn, gate, dtype), mask=mask)
    else:
        _store_partials(part_acc, part_max, part_sum, seq, heads, split, m_i, l_i, acc, g_mask, offs_d, d_mask,
                        NUM_Q_HEADS, HEAD_DIM, NUM_SPLITS)


def attention_decode(
    projected: torch.Tensor,  # [B, P]: [q_gate | k | v]
    q_norm_weight: torch.Tensor,  # [D]
    k_norm_weight: torch.Tensor,  # [D]
    eps: float,
    inv_freq: torch.Tensor,  # [rotary_dim / 2] fp32
    positions: torch.Tensor,  # [B] int64
    k_cache: torch.Tensor,  # [NB, BS, Hkv, D]  (written at slot_mapping)
    v_cache: torch.Tensor,  # [NB, BS, Hkv, D]  (written at slot_mapping)
    slot_mapping: torch.Tensor,  # [B] int64: the cache row of position context_lens[b] - 1
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B] int32, the new token included
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int | None = None,
    early_loads: bool | None = None,
    query_rows: int | None = None,
    reduce_parts: int | None = None,
) -> torch.Tensor:
    """The op's CUDA kernel (also on CPU tensors under ``TRITON_INTERPRET=1``); ``num_splits``, ``block_n``,
    ``num_warps``, ``num_stages``, ``early_loads``, ``query_rows`` and ``reduce_parts`` override the defaults (the
    paged decode kernel's split count and key tile, 4 warps, ``decode_stages``, early loads up to
    ``EARLY_LOADS_MAX_BATCH`` sequences, the query tile's rows: the GQA group rounded up to a power of two, the reduce
    kernel's programs a query head: ``reduce_splits``')."""
    check_attention_decode_args(projected, inv_freq, k_cache, num_heads, num_kv_heads, head_dim)
    group = num_heads // num_kv_heads
    if query_rows is None:
        query_rows = triton.next_power_of_2(group)
    elif query_rows < group or query_rows & (query_rows - 1):
        raise ValueError(f"query_rows must be a power of two >= the GQA group ({group}), got {query_rows}")
    batch = projected.shape[0]
    out = torch.empty((batch, num_heads * head_dim), dtype=projected.dtype, device=projected.device)
    if batch == 0:
        return out
    block_size = k_cache.shape[1]
    if num_splits is None:
        num_splits = decode_num_splits(batch, num_kv_heads, block_tables.shape[1], block_size, projected.device)
    if num_stages is None:
        num_stages = decode_stages(batch)
    dot_fp32 = _dot_fp32(projected, k_cache)
    if block_n is None:
        block_n = _tile_n(head_dim, 4 if dot_fp32 else k_cache.element_size())
    if num_splits > 1:
        part_acc = torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32, device=out.device)
        part_max = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=out.device)
        part_sum = torch.empty_like(part_max)
    else:
        part_acc = part_max = part_sum = out  # never touched: the kernel writes `out` directly
    q_norm_weight, k_norm_weight, inv_freq = unit_stride(q_norm_weight, k_norm_weight, inv_freq)
    positions, context_lens, slot_mapping = unit_stride(positions, context_lens, slot_mapping)
    _attention_decode_kernel[(batch, num_kv_heads, num_splits)](
        projected,
        q_norm_weight,
        k_norm_weight,
        inv_freq,
        positions,
        k_cache,
        v_cache,
        slot_mapping,
        block_tables,
        context_lens,
        out,
        part_acc,
        part_max,
        part_sum,
        eps,
        scale * LOG2E,
        *projected.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *block_tables.stride(),
        NUM_Q_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        GROUP_P=query_rows,
        HEAD_DIM=head_dim,
        HEAD_DIM_P=triton.next_power_of_2(head_dim),
        ROTARY_HALF=inv_freq.shape[0],
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n,
        NUM_SPLITS=num_splits,
        EARLY_LOADS=batch <= EARLY_LOADS_MAX_BATCH if early_loads is None else early_loads,
        DOT_FP32=dot_fp32,
        num_warps=num_warps,
        **({} if num_stages is None else {"num_stages": num_stages}),
        **pdl_flags(projected),
    )
    if num_splits > 1:
        # gate_h of each row: D channels at offset (2h + 1) * D of projected, as a [B, Hq, D] view (no copy)
        stride_b, stride_c = projected.stride()
        gate = projected.as_strided((batch, num_heads, head_dim), (stride_b, 2 * head_dim * stride_c, stride_c),
                                    projected.storage_offset() + head_dim * stride_c)
        reduce_splits(part_acc, part_max, part_sum, out.view(batch, num_heads, head_dim), gate, use_pdl=True,
                      channel_parts=reduce_parts)
    return out
