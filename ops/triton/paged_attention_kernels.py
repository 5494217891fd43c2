"""Triton kernels for ``ce::paged_attention_decode`` and ``ce::paged_attention_prefill``, and the choice between
them for ``ce::paged_attention_verify``.

Both kernels walk a sequence's cached tokens in tiles of ``BLOCK_N`` tokens, translating token -> (block table entry,
offset) per token, so any power-of-two ``block_size`` works (also one smaller than the tile), and run an online
softmax in fp32 (exp2 with ``scale * log2(e)`` folded into the scores). GQA: one program serves all
``G = Hq / Hkv`` query heads of a KV head, so each K/V tile is read once per group, not once per query head.
The query heads of a group are rows of the ``tl.dot`` left operand, the group rounded up to a power of two (Triton
pads a dot's M side to the mma's 16 itself; older Tritons asked for M >= 16, and the decode kernels padded to it).

Decode is flash-decoding: grid ``(B, Hkv, NUM_SPLITS)``; split ``s`` covers the ``s``-th slice of the sequence's
*actual* context (slice length computed on the device from ``context_lens``), so the grid is fixed by static
shapes (CUDA-graph capturable, no host sync) while the work stays balanced for any context length. With one
split the kernel writes the normalised output itself; otherwise a reduce kernel merges the per-split
(max, sum, accumulator) triples (:func:`_merge_splits`). ``context_len == 0`` (padding lane) gives zeros.
``ce::attention_decode`` (ops/triton/attention_decode_kernels.py) reuses the tile helpers, the partials' layout and
the reduce kernel.

A verify step of speculative decoding (``ce::paged_attention_verify``: each sequence's last token and its drafts,
the same number of rows for every sequence) runs either kernel: with few sequences each row as a decode query over
its own causal prefix (the context split over many programs), else the prefill kernel (each K/V tile read once for
all of a sequence's rows); ``verify_by_rows`` decides.

Prefill is a varlen flash-attention forward over the paged cache: a program owns ``BLOCK_M`` new tokens of one
sequence times the ``G`` query heads of one KV head, and attends causally by absolute position to the cached
prefix plus the new tokens (whose K/V ``store_kv`` already wrote). The tile -> sequence map is built on the device
from ``cu_seqlens_q`` inside the kernel, so prefill needs no host sync and no extra launches either.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ops.layouts import verify_cu_seqlens
from ops.triton import unit_stride
from ops.triton.pdl import pdl_flags


# Prefill tiles find their sequence by a prefix sum over the step's sequence lengths, SEQS_P wide. At least 256 wide,
# so the kernel is compiled once for every step of up to 256 sequences instead of once per power of two (a variant
# compiled in the middle of serving stalls that step ~1 s); 256 lengths per program are a negligible load.
MIN_SEQS_P = 256

LOG2E = math.log2(math.e)
# An "empty" running max: finite, so exp2(m_old - m_new) never evaluates -inf - (-inf) = nan for a row or split
# that has seen no key yet; any real score is far above it.
NEG_BIG = tl.constexpr(-1.0e30)


@triton.jit
def _kv_blocks(block_table_row, stride_bt, offs_n, n_mask, BLOCK_SIZE: tl.constexpr):
    """The pool block of each token position ``offs_n`` (masked positions: block 0), int64."""
    return tl.load(block_table_row + (offs_n // BLOCK_SIZE) * stride_bt, mask=n_mask, other=0).to(tl.int64)


@triton.jit
def _load_kv_rows(cache, blocks, offs_n, n_mask, kv_head, offs_d, d_mask, stride_block, stride_offset, stride_head,
                  stride_dim, BLOCK_SIZE: tl.constexpr):
    """[BLOCK_N, D] rows of one KV head for token positions ``offs_n`` in pool blocks ``blocks`` (masked rows read
    as 0)."""
    rows = blocks * stride_block + (offs_n % BLOCK_SIZE) * stride_offset
    ptrs = cache + rows[:, None] + kv_head * stride_head + offs_d[None, :] * stride_dim
    return tl.load(ptrs, mask=n_mask[:, None] & d_mask[None, :], other=0.0)


@triton.jit
def _load_kv_tile(
    cache,
    block_table_row,  # pointer to this sequence's block table row
    stride_bt,
    offs_n,  # [BLOCK_N] token positions
    n_mask,
    kv_head,
    offs_d,
    d_mask,
    stride_block,
    stride_offset,
    stride_head,
    stride_dim,
    BLOCK_SIZE: tl.constexpr,
):
    """[BLOCK_N, D] rows of one KV head for token positions ``offs_n`` (masked rows read as 0)."""
    blocks = _kv_blocks(block_table_row, stride_bt, offs_n, n_mask, BLOCK_SIZE)
    return _load_kv_rows(cache, blocks, offs_n, n_mask, kv_head, offs_d, d_mask, stride_block, stride_offset,
                         stride_head, stride_dim, BLOCK_SIZE)


@triton.jit
def _attend_tile(q, k, v, scores_mask, m_i, l_i, acc, scale_log2, DOT_FP32: tl.constexpr):
    """One online-softmax step: fold keys ``k``/values ``v`` [BLOCK_N, D] into (m_i, l_i, acc) for rows ``q``."""
    if DOT_FP32:
        # fp32 (or mixed-dtype) inputs: exact fp32 products, not TF32, so the kernel matches the fp32 reference.
        s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
    else:
        s = tl.dot(q, tl.trans(k))
    s = tl.where(scores_mask, s * scale_log2, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    if DOT_FP32:
        pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def _attend_range(q, k_cache, v_cache, bt_row, stride_bt_n, start, end, kv_head, offs_d, d_mask,
                  stride_k_block, stride_k_offset, stride_k_head, stride_k_dim,
                  stride_v_block, stride_v_offset, stride_v_head, stride_v_dim,
                  m_i, l_i, acc, scale_log2, query_positions, BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
                  DOT_FP32: tl.constexpr, CAUSAL: tl.constexpr):
    """Fold the cached keys/values at positions ``[start, end)`` of one sequence's KV head (block table row
    ``bt_row``) into (m_i, l_i, acc), BLOCK_N at a time: a decode split's or a prefill tile's whole key loop.
    ``CAUSAL``: each query row sees only keys at or before its own position (``query_positions``, one per row;
    unused otherwise)."""
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        k = _load_kv_tile(k_cache, bt_row, stride_bt_n, offs_n, n_mask, kv_head, offs_d, d_mask,
                          stride_k_block, stride_k_offset, stride_k_head, stride_k_dim, BLOCK_SIZE)
        v = _load_kv_tile(v_cache, bt_row, stride_bt_n, offs_n, n_mask, kv_head, offs_d, d_mask,
                          stride_v_block, stride_v_offset, stride_v_head, stride_v_dim, BLOCK_SIZE)
        visible = n_mask[None, :]
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= query_positions[:, None])
        m_i, l_i, acc = _attend_tile(q, k, v, visible, m_i, l_i, acc, scale_log2, DOT_FP32)
    return m_i, l_i, acc


@triton.jit
def _store_partials(part_acc, part_max, part_sum, seq, heads, split, m_i, l_i, acc, g_mask, offs_d, d_mask,
                    NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr):
    """A split's (max, sum, accumulator) for query heads ``heads``, where ``_paged_decode_reduce_kernel`` reads them."""
    row = (seq * NUM_Q_HEADS + heads) * NUM_SPLITS + split  # [GROUP_P] index into [B, Hq, NUM_SPLITS]
    tl.store(part_max + row, m_i, mask=g_mask)
    tl.store(part_sum + row, l_i, mask=g_mask)
    tl.store(part_acc + row[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=g_mask[:, None] & d_mask[None, :])


@triton.jit
def _merge_splits(part_acc, part_max, part_sum, row0, offs_s, s_mask, offs_d, d_mask, HEAD_DIM: tl.constexpr):
    """One query head's attention output ``[HEAD_DIM_P]`` (fp32) from its splits' (max, sum, accumulator) triples,
    which ``_store_partials`` wrote at rows ``row0 + offs_s`` of ``[B * Hq * NUM_SPLITS]``."""
    row = row0 + offs_s
    m = tl.load(part_max + row, mask=s_mask, other=NEG_BIG)
    l = tl.load(part_sum + row, mask=s_mask, other=0.0)
    m_all = tl.max(m, 0)
    # Empty splits have m = NEG_BIG and l = acc = 0, so their weight is exp2(NEG_BIG - m_all) = 0 whenever any
    # split saw a key, and the sum is 0 (-> zeros) when none did (padding lane).
    w = tl.exp2(m - m_all)
    total = tl.sum(w * l, 0)
    # A split's sum is 0 exactly when it saw no key (its largest score alone adds exp2(0) = 1), and then it stored
    # acc = +0.0, which is what the masked load returns: skipping those rows changes no bit and saves their traffic
    # (most splits are empty at short contexts: batch 1 has 128 splits of >= 64 tokens). ``!=``, not ``>``: a NaN sum
    # still loads its row (NaN in, NaN out, as before).
    acc = tl.load(part_acc + row[:, None] * HEAD_DIM + offs_d[None, :],
                  mask=(s_mask & (l != 0.0))[:, None] & d_mask[None, :], other=0.0)
    return tl.sum(acc * w[:, None], 0) / tl.where(total > 0, total, 1.0)


@triton.jit
def _sigmoid_gated(attn, gate, dtype: tl.constexpr):
    """``attn * sigmoid(gate)`` in ``dtype``, rounded where the model's unfused ``attn * torch.sigmoid(gate)`` rounds:
    the attention output and the sigmoid each in ``dtype``, then their product."""
    a = attn.to(dtype).to(tl.float32)
    g = tl.sigmoid(gate.to(tl.float32)).to(dtype).to(tl.float32)
    return (a * g).to(dtype)


@triton.jit
def _paged_decode_kernel(
    q_ptr,
    k_cache,
    v_cache,
    block_tables,  # [B / ROWS_PER_SEQ, max_blocks]
    context_lens,  # [B / ROWS_PER_SEQ]
    out_ptr,
    part_acc,  # [B, Hq, NUM_SPLITS, D] fp32 (unused when NUM_SPLITS == 1)
    part_max,  # [B, Hq, NUM_SPLITS] fp32
    part_sum,  # [B, Hq, NUM_SPLITS] fp32
    gate_ptr,  # GATED: [B, Hq, D] by the strides below (the output is attn * sigmoid(gate)); else unused
    scale_log2,
    stride_q_b,
    stride_q_h,
    stride_q_d,
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
    stride_o_b,
    stride_o_h,
    stride_o_d,
    stride_g_b,
    stride_g_h,
    stride_g_d,
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_P: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    DOT_FP32: tl.constexpr,
    ROWS_PER_SEQ: tl.constexpr,  # query rows a sequence: 1 (decode), or a verify's k + 1 rows, each its own prefix
    GATED: tl.constexpr = False,  # one split: the gate applied here (more: by the reduce kernel)
):
    seq = tl.program_id(0).to(tl.int64)  # the query row (q, out and the partials are by row)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    # Row j of a sequence's R rows holds position context_len - R + j: its causal prefix is context_len - R + j + 1
    # tokens of the sequence's table (a verify's rows; at R = 1 the decode query and its whole context).
    owner = seq // ROWS_PER_SEQ
    context_len = tl.maximum(tl.load(context_lens + owner) - (ROWS_PER_SEQ - 1 - seq % ROWS_PER_SEQ), 0)
    # This split's slice of the actual context, a whole number of tiles.
    per_split = tl.cdiv(tl.cdiv(context_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per_split
    end = tl.minimum(start + per_split, context_len)

    offs_g = tl.arange(0, GROUP_P)
    offs_d = tl.arange(0, HEAD_DIM_P)
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_g
    q = tl.load(
        q_ptr + seq * stride_q_b + heads[:, None] * stride_q_h + offs_d[None, :] * stride_q_d,
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if DOT_FP32:
        q = q.to(tl.float32)
    else:
        q = q.to(k_cache.dtype.element_ty)

    m_i = tl.full([GROUP_P], NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([GROUP_P], dtype=tl.float32)
    acc = tl.zeros([GROUP_P, HEAD_DIM_P], dtype=tl.float32)
    m_i, l_i, acc = _attend_range(q, k_cache, v_cache, block_tables + owner * stride_bt_b, stride_bt_n, start, end,
                                  kv_head, offs_d, d_mask, stride_k_block, stride_k_offset, stride_k_head,
                                  stride_k_dim, stride_v_block, stride_v_offset, stride_v_head, stride_v_dim, m_i,
                                  l_i, acc, scale_log2, m_i, BLOCK_SIZE, BLOCK_N, DOT_FP32, False)  # no query positions

    if NUM_SPLITS == 1:
        # l_i == 0 only for a padding lane (context_len 0), whose acc is 0: write zeros, not 0/0.
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        mask = g_mask[:, None] & d_mask[None, :]
        if GATED:
            gate = tl.load(gate_ptr + seq * stride_g_b + heads[:, None] * stride_g_h + offs_d[None, :] * stride_g_d,
                           mask=mask, other=0.0)
            out = _sigmoid_gated(out, gate, out_ptr.dtype.element_ty)
        tl.store(
            out_ptr + seq * stride_o_b + heads[:, None] * stride_o_h + offs_d[None, :] * stride_o_d,
            out.to(out_ptr.dtype.element_ty),
            mask=mask,
        )
    else:
        _store_partials(part_acc, part_max, part_sum, seq, heads, split, m_i, l_i, acc, g_mask, offs_d, d_mask,
                        NUM_Q_HEADS, HEAD_DIM, NUM_SPLITS)


@triton.jit
def _paged_decode_reduce_kernel(
    part_acc,
    part_max,
    part_sum,
    out_ptr,
    gate_ptr,  # GATED: [B, Hq, D] by the strides below; the output is attn * sigmoid(gate)
    stride_o_b,
    stride_o_h,
    stride_o_d,
    stride_g_b,
    stride_g_h,
    stride_g_d,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    NUM_SPLITS_P: tl.constexpr,
    BLOCK_D: tl.constexpr,  # the channels a program merges (program_id(2) picks which)
    GATED: tl.constexpr,
    USE_PDL: tl.constexpr,  # ops/triton/pdl.py: no weights to load, so it waits at once
):
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    offs_s = tl.arange(0, NUM_SPLITS_P)
    offs_d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)
    s_mask = offs_s < NUM_SPLITS
    d_mask = offs_d < HEAD_DIM
    row0 = (seq * NUM_Q_HEADS + head) * NUM_SPLITS
    if GATED:  # issued with the first partials' loads, not after the merge: one round trip to memory fewer
        gate = tl.load(gate_ptr + seq * stride_g_b + head * stride_g_h + offs_d * stride_g_d, mask=d_mask, other=0.0)
    out = _merge_splits(part_acc, part_max, part_sum, row0, offs_s, s_mask, offs_d, d_mask, HEAD_DIM)
    if GATED:
        out = _sigmoid_gated(out, gate, out_ptr.dtype.element_ty)
    tl.store(out_ptr + seq * stride_o_b + head * stride_o_h + offs_d * stride_o_d,
             out.to(out_ptr.dtype.element_ty), mask=d_mask)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # CPU tensors only reach here under TRITON_INTERPRET=1; any small number will do


def _dot_fp32(q: torch.Tensor, cache: torch.Tensor) -> bool:
    return q.dtype == torch.float32 or cache.dtype == torch.float32 or q.dtype != cache.dtype


def _tile_n(head_dim: int, element_size: int) -> int:
    """Tokens per K/V tile: 32 KiB tiles (64 tokens of D = 256 in bf16), at least 16 (tl.dot), at most 64.

    64-token tiles keep a large-batch decode near copy bandwidth, where 32-token tiles fall well short
    (bench/NOTES.md, "Paged attention tile and splits").
    """
    return max(16, min(64, 32768 // (triton.next_power_of_2(head_dim) * element_size)))


# decode_num_splits' ceiling (the reduce kernel loads all splits' partials as one tile). The rule reaches it at batch 1
# only (two KV heads): 128 splits of a 9,216-wide table take 2 key tiles each where 64 take 3 past 8,192 tokens, and
# the batch-1 decode graph at 8,704 tokens was 12-17 µs faster, level at 512 (bench/NOTES.md, "Fifty-third session").
MAX_SPLITS = 128


def decode_num_splits(batch: int, kv_heads: int, max_blocks: int, block_size: int, device: torch.device) -> int:
    """Number of context splits, from static shapes only (CUDA-graph safe).

    Enough (batch x kv_head x split) programs to fill the GPU about twice, but splits of at least 64 tokens of
    the longest possible context (the block table's width), at most ``MAX_SPLITS``, and a power of two (fewer
    compiled variants). Fewer splits leave a batch-1 decode slower (bench/NOTES.md, "Paged attention tile and
    splits").
    """
    want = triton.cdiv(2 * _sm_count(device), max(1, batch * kv_heads))
    cap = triton.cdiv(max_blocks * block_size, 64)
    splits = max(1, min(want, cap, MAX_SPLITS))
    return 1 << (splits.bit_length() - 1)


MIN_REDUCE_CHANNELS = 32  # a reduce program's slice: at least a 128-byte line of each split's fp32 accumulator


def reduce_parts(heads: int, head_dim_p: int, device: torch.device) -> int:
    """The programs each of ``heads`` (batch x query heads) merges its channels over: enough for about one program
    an SM, in slices of at least ``MIN_REDUCE_CHANNELS``, a power of two. At batch 1 a program per head alone leaves
    8 programs each loading every split's whole accumulator (128 KB at 128 splits), a long dependent step."""
    parts = triton.next_power_of_2(triton.cdiv(_sm_count(device), max(1, heads)))
    return max(1, min(parts, head_dim_p // MIN_REDUCE_CHANNELS))


def reduce_warps(num_splits_p: int, block_d: int) -> int:
    """The reduce kernel's warps: its [splits, channels] tile at about 1,024 values a warp, 1 to 4 warps."""
    return max(1, min(4, num_splits_p * block_d // 1024))


def reduce_splits(
    part_acc: torch.Tensor,  # [B, Hq, NUM_SPLITS, D] fp32
    part_max: torch.Tensor,  # [B, Hq, NUM_SPLITS] fp32
    part_sum: torch.Tensor,  # [B, Hq, NUM_SPLITS] fp32
    out: torch.Tensor,  # [B, Hq, D], any strides (written)
    gate: torch.Tensor | None = None,  # [B, Hq, D], any strides: out = attn * sigmoid(gate)
    use_pdl: bool = False,  # launched with PDL (ops/triton/pdl.py) after a PDL split kernel
    channel_parts: int | None = None,  # programs a query head's channels are split over (default: reduce_parts)
) -> None:
    """Merge the split kernel's per-split (max, sum, accumulator) triples into ``out``: a program per query head and
    slice of its channels."""
    batch, num_q_heads, num_splits, head_dim = part_acc.shape
    head_dim_p = triton.next_power_of_2(head_dim)
    num_splits_p = triton.next_power_of_2(num_splits)
    if channel_parts is None:
        channel_parts = reduce_parts(batch * num_q_heads, head_dim_p, part_acc.device)
    elif channel_parts < 1 or channel_parts & (channel_parts - 1) or channel_parts > head_dim_p:
        raise ValueError(f"channel_parts must be a power of two up to {head_dim_p}, got {channel_parts}")
    block_d = head_dim_p // channel_parts
    gate_or_out = out if gate is None else gate  # a placeholder pointer the GATED=False kernel never reads
    _paged_decode_reduce_kernel[(batch, num_q_heads, channel_parts)](
        part_acc,
        part_max,
        part_sum,
        out,
        gate_or_out,
        *out.stride(),
        *gate_or_out.stride(),
        NUM_Q_HEADS=num_q_heads,
        HEAD_DIM=head_dim,
        HEAD_DIM_P=head_dim_p,
        NUM_SPLITS=num_splits,
        NUM_SPLITS_P=num_splits_p,
        BLOCK_D=block_d,
        GATED=gate is not None,
        num_warps=reduce_warps(num_splits_p, block_d),
        **(pdl_flags(out) if use_pdl else {"USE_PDL": False}),
    )


def paged_attention_decode(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [NB, BS, Hkv, D]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [>= B / rows_per_seq, max_blocks] int32
    context_lens: torch.Tensor,  # [>= B / rows_per_seq] int32
    scale: float,
    num_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    query_rows: int | None = None,
    rows_per_seq: int = 1,
    gate: torch.Tensor | None = None,  # [B, Hq, D], any strides
) -> torch.Tensor:
    """The op's CUDA kernel; ``num_splits``, ``block_n``, ``num_warps`` and ``query_rows`` override the defaults
    (``decode_num_splits``, ``_tile_n``, 4 warps, the query tile's rows: the GQA group rounded up to a power of two,
    as ce::attention_decode's; Triton pads the ``tl.dot``'s M side to the mma's 16 itself). ``rows_per_seq`` R: q's
    rows come R a sequence (a verify step's), row j of a sequence attending to its first ``context_len - R + j + 1``
    tokens, each its own decode query; the tables and lengths are the sequences'. ``gate``: returns ``attn *
    sigmoid(gate)``, gated where the output is written (the one split's kernel, or the reduce kernel)."""
    batch, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    sequences = batch // rows_per_seq
    if batch % rows_per_seq or min(context_lens.shape[0], block_tables.shape[0]) < sequences:
        raise ValueError(f"paged_attention_decode: {batch} query rows, {rows_per_seq} a sequence, for "
                         f"{context_lens.shape[0]} context lengths and {block_tables.shape[0]} block tables")
    out = q.new_empty(q.shape)  # contiguous, like the reference's output (the fake kernel matches it)
    if batch == 0:
        return out
    group = num_q_heads // num_kv_heads
    if query_rows is None:
        query_rows = triton.next_power_of_2(group)
    elif query_rows < group or query_rows & (query_rows - 1):
        raise ValueError(f"query_rows must be a power of two >= the GQA group ({group}), got {query_rows}")
    if num_splits is None:
        num_splits = decode_num_splits(batch, num_kv_heads, block_tables.shape[1], block_size, q.device)
    if block_n is None:
        block_n = _tile_n(head_dim, 4 if _dot_fp32(q, k_cache) else k_cache.element_size())
    head_dim_p = triton.next_power_of_2(head_dim)
    if num_splits > 1:
        part_acc = torch.empty(batch, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_max = torch.empty(batch, num_q_heads, num_splits, dtype=torch.float32, device=q.device)
        part_sum = torch.empty_like(part_max)
    else:
        part_acc = part_max = part_sum = out  # never touched: the kernel writes `out` directly
    context_lens = unit_stride(context_lens)
    gate_or_out = out if gate is None else gate  # a placeholder pointer the GATED=False kernel never reads
    _paged_decode_kernel[(batch, num_kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        out,
        part_acc,
        part_max,
        part_sum,
        gate_or_out,
        scale * LOG2E,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *block_tables.stride(),
        *out.stride(),
        *gate_or_out.stride(),
        NUM_Q_HEADS=num_q_heads,
        GROUP=group,
        GROUP_P=query_rows,
        HEAD_DIM=head_dim,
        HEAD_DIM_P=head_dim_p,
        BLOCK_SIZE=block_size,
        BLOCK_N=block_n,
        NUM_SPLITS=num_splits,
        DOT_FP32=_dot_fp32(q, k_cache),
        ROWS_PER_SEQ=rows_per_seq,
        GATED=gate is not None and num_splits == 1,
        num_warps=num_warps,
    )
    if num_splits > 1:
        reduce_splits(part_acc, part_max, part_sum, out, gate)
    return out


@triton.jit(do_not_specialize=["num_seqs"])  # a new count every step: no "divisible by 16" / "== 1" variants
def _paged_prefill_kernel(
    q_ptr,
    k_cache,
    v_cache,
    cu_seqlens_q,
    context_lens,
    block_tables,
    out_ptr,
    gate_ptr,  # GATED: [T, Hq, D] by the strides below (the output is attn * sigmoid(gate)); else unused
    num_seqs,
    scale_log2,
    stride_q_t,
    stride_q_h,
    stride_q_d,
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
    stride_o_t,
    stride_o_h,
    stride_o_d,
    stride_g_t,
    stride_g_h,
    stride_g_d,
    GROUP: tl.constexpr,
    GROUP_P: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_M: tl.constexpr,  # new tokens per program; rows of the tile = BLOCK_M * GROUP_P
    BLOCK_N: tl.constexpr,
    SEQS_P: tl.constexpr,  # next power of two >= N
    DOT_FP32: tl.constexpr,
    GATED: tl.constexpr = False,
):
    # Tiles in reverse: a sequence's last tiles, which see the most keys, start first and the short ones fill the
    # tail of the grid.
    tile = tl.num_programs(0) - 1 - tl.program_id(0)
    kv_head = tl.program_id(1)
    # Tile -> (sequence, query block), computed here rather than by torch ops on the host side (each costs a
    # launch in eager prefill): sequence n owns ceil(q_len_n / BLOCK_M) consecutive tiles.
    offs_s = tl.arange(0, SEQS_P)
    s_mask = offs_s < num_seqs
    seq_lens = tl.load(cu_seqlens_q + offs_s + 1, mask=s_mask, other=0) - tl.load(cu_seqlens_q + offs_s,
                                                                                    mask=s_mask, other=0)
    tiles = (seq_lens + (BLOCK_M - 1)) // BLOCK_M
    tiles_through = tl.cumsum(tiles, 0)  # inclusive
    # The owner is the number of sequences whose tiles all come before this one (empty sequences included);
    # a spare tile past the last one clamps to the last sequence and finds its query block past the end.
    seq_idx = tl.minimum(tl.sum((tiles_through <= tile).to(tl.int32), 0), num_seqs - 1)
    q_block = tile - tl.sum(tl.where(offs_s == seq_idx, tiles_through - tiles, 0), 0)
    seq = seq_idx.to(tl.int64)
    q_start = tl.load(cu_seqlens_q + seq)
    q_len = tl.load(cu_seqlens_q + seq + 1) - q_start
    context_len = tl.load(context_lens + seq)
    prefix = context_len - q_len

    ROWS: tl.constexpr = BLOCK_M * GROUP_P
    offs_r = tl.arange(0, ROWS)
    token = q_block * BLOCK_M + offs_r // GROUP_P  # token index within the sequence's new tokens
    g = offs_r % GROUP_P
    row_mask = (token < q_len) & (g < GROUP)
    position = prefix + token  # absolute position: causal mask is key_position <= position
    heads = kv_head * GROUP + g
    offs_d = tl.arange(0, HEAD_DIM_P)
    d_mask = offs_d < HEAD_DIM
    q_rows = (q_start + token).to(tl.int64)
    q = tl.load(
        q_ptr + q_rows[:, None] * stride_q_t + heads[:, None] * stride_q_h + offs_d[None, :] * stride_q_d,
        mask=row_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    if DOT_FP32:
        q = q.to(tl.float32)
    else:
        q = q.to(k_cache.dtype.element_ty)

    # Keys this tile can see: positions 0 .. prefix + (last new token of the tile); none for a tile past the
    # sequence's end (the spare tiles of the static grid).
    tile_last = tl.minimum(q_len, (q_block + 1) * BLOCK_M)
    kv_end = tl.where(q_block * BLOCK_M < q_len, prefix + tile_last, 0)

    m_i = tl.full([ROWS], NEG_BIG, dtype=tl.float32)
    l_i = tl.zeros([ROWS], dtype=tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM_P], dtype=tl.float32)
    bt_row = block_tables + seq * stride_bt_b
    # Keys before the tile's first new token are visible to every row: whole tiles of them need no causal mask.
    causal_start = tl.minimum(((prefix + q_block * BLOCK_M) // BLOCK_N) * BLOCK_N, kv_end)
    m_i, l_i, acc = _attend_range(q, k_cache, v_cache, bt_row, stride_bt_n, 0, causal_start,
                                  kv_head, offs_d, d_mask, stride_k_block, stride_k_offset, stride_k_head,
                                  stride_k_dim, stride_v_block, stride_v_offset, stride_v_head, stride_v_dim,
                                  m_i, l_i, acc, scale_log2, position, BLOCK_SIZE, BLOCK_N, DOT_FP32, False)
    m_i, l_i, acc = _attend_range(q, k_cache, v_cache, bt_row, stride_bt_n, causal_start, kv_end,
                                  kv_head, offs_d, d_mask, stride_k_block, stride_k_offset, stride_k_head,
                                  stride_k_dim, stride_v_block, stride_v_offset, stride_v_head, stride_v_dim,
                                  m_i, l_i, acc, scale_log2, position, BLOCK_SIZE, BLOCK_N, DOT_FP32, True)

    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    mask = row_mask[:, None] & d_mask[None, :]
    if GATED:
        gate = tl.load(gate_ptr + q_rows[:, None] * stride_g_t + heads[:, None] * stride_g_h
                       + offs_d[None, :] * stride_g_d, mask=mask, other=0.0)
        out = _sigmoid_gated(out, gate, out_ptr.dtype.element_ty)
    tl.store(
        out_ptr + q_rows[:, None] * stride_o_t + heads[:, None] * stride_o_h + offs_d[None, :] * stride_o_d,
        out.to(out_ptr.dtype.element_ty),
        mask=mask,
    )


@dataclass(frozen=True)
class PrefillTile:
    """A prefill program's shape: ``rows`` query rows (token x head: the ``tl.dot`` M dimension), ``block_n`` keys
    a step, and its launch's warps and software-pipelining stages (None: Triton's default)."""

    rows: int
    block_n: int
    num_warps: int
    num_stages: int | None = None


def prefill_tile(head_dim: int, dot_fp32: bool) -> PrefillTile:
    """The prefill kernel's tile. 16-bit inputs: 128 rows, 64 keys, 8 warps, 3 stages, the fastest of a sweep over
    rows, keys, warps and stages on an H200 (bench/attention_prefill_sweep.py; bench/NOTES.md "Runs 74-78"), 2.2x
    the 64-row tile on one 8,192-token prompt. fp32 (tests, the CPU-exact path): 64 rows, whose
    tiles fit the shared memory at twice the bytes."""
    if not dot_fp32:
        return PrefillTile(rows=128, block_n=_tile_n(head_dim, 2), num_warps=8, num_stages=3)
    return PrefillTile(rows=64, block_n=_tile_n(head_dim, 4),
                       num_warps=8 if triton.next_power_of_2(head_dim) >= 256 else 4)


def _verify_tile(head_dim: int, dot_fp32: bool) -> PrefillTile:
    """A verify step's tile: the 64-row tile it ran before the prefill's changed (not re-measured). Its 2-5 rows a
    sequence fill a 128-row tile no better, and the smaller accumulator leaves more programs an SM for what is a
    memory-bound walk over the context."""
    return PrefillTile(rows=64, block_n=_tile_n(head_dim, 4 if dot_fp32 else 2),
                       num_warps=8 if triton.next_power_of_2(head_dim) >= 256 else 4)


def paged_attention_prefill(
    q: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,  # [N + 1] int32
    context_lens: torch.Tensor,  # [N] int32
    block_tables: torch.Tensor,  # [N, max_blocks] int32
    scale: float,
    tile: PrefillTile | None = None,  # None: prefill_tile
    gate: torch.Tensor | None = None,  # [T, Hq, D], any strides: the output is attn * sigmoid(gate)
) -> torch.Tensor:
    num_tokens, num_q_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_seqs = context_lens.shape[0]
    out = q.new_empty(q.shape)  # contiguous, like the reference's output (the fake kernel matches it)
    if num_tokens == 0 or num_seqs == 0:
        return out
    dot_fp32 = _dot_fp32(q, k_cache)
    tile = tile or prefill_tile(head_dim, dot_fp32)
    group = num_q_heads // num_kv_heads
    group_p = triton.next_power_of_2(group)
    block_m = max(1, tile.rows // group_p)

    # The grid has the static upper bound sum_n ceil(q_len_n / BLOCK_M) <= cdiv(T, BLOCK_M) + N tiles, so it needs
    # no host sync; spare programs find an empty key range.
    grid_tiles = triton.cdiv(num_tokens, block_m) + num_seqs

    cu_seqlens_q, context_lens = unit_stride(cu_seqlens_q, context_lens)
    gate_or_out = out if gate is None else gate  # a placeholder pointer the GATED=False kernel never reads
    _paged_prefill_kernel[(grid_tiles, num_kv_heads)](
        q,
        k_cache,
        v_cache,
        cu_seqlens_q,
        context_lens,
        block_tables,
        out,
        gate_or_out,
        num_seqs,
        scale * LOG2E,
        *q.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        *block_tables.stride(),
        *out.stride(),
        *gate_or_out.stride(),
        GROUP=group,
        GROUP_P=group_p,
        HEAD_DIM=head_dim,
        HEAD_DIM_P=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=block_size,
        BLOCK_M=block_m,
        BLOCK_N=tile.block_n,
        SEQS_P=max(MIN_SEQS_P, triton.next_power_of_2(num_seqs)),
        DOT_FP32=dot_fp32,
        GATED=gate is not None,
        num_warps=tile.num_warps,
        **({} if tile.num_stages is None else {"num_stages": tile.num_stages}),
    )
    return out


def verify_by_rows(num_seqs: int, num_kv_heads: int, device: torch.device) -> bool:
    """Whether a verify step's attention runs each row as a decode query (True) or runs the prefill kernel. The
    prefill kernel gives each (sequence, KV head) one program that walks the whole context; while those programs
    would fill at most a quarter of the SMs, the rows' split decode (every row reading its prefix again, k + 1 times
    the K/V bytes) finishes sooner, the more so the longer the context."""
    return 4 * num_seqs * num_kv_heads <= _sm_count(device)


def paged_attention_verify(
    q: torch.Tensor,  # [N * R, Hq, D]: R rows a sequence
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    context_lens: torch.Tensor,  # [N] int32, cached tokens after this step
    block_tables: torch.Tensor,  # [N, max_blocks] int32
    rows_per_seq: int,
    scale: float,
    gate: torch.Tensor | None = None,  # [N * R, Hq, D], any strides: the output is attn * sigmoid(gate)
    by_rows: bool | None = None,  # None: verify_by_rows
) -> torch.Tensor:
    num_seqs = context_lens.shape[0]
    if by_rows is None:
        by_rows = verify_by_rows(num_seqs, k_cache.shape[2], q.device)
    if by_rows:  # row j of a sequence holds position context_len - R + j: its causal prefix is that long + 1
        return paged_attention_decode(q, k_cache, v_cache, block_tables, context_lens, scale,
                                      rows_per_seq=rows_per_seq, gate=gate)
    return paged_attention_prefill(q, k_cache, v_cache, verify_cu_seqlens(num_seqs, rows_per_seq, q.device),
                                   context_lens, block_tables, scale, _verify_tile(q.shape[-1], _dot_fp32(q, k_cache)),
                                   gate=gate)
