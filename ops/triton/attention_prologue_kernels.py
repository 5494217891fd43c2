"""Triton kernel for ``ce::attention_prologue``: q and k normalised and rotated, k and v stored in the paged cache.

Grid ``(T, Hkv)``: program (t, h) normalises and rotates the ``G = Hq / Hkv`` query heads of KV head h of token t
(``_norm_rope_values``, the fused decode kernel's: the same roundings as the reference) and writes them to q, and does
the same for k, which it stores with v at ``slot_mapping[t]``. Memory-bound: each element is read and written once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.triton import unit_stride
from ops.triton.attention_decode_kernels import (
    _cos_sin, _norm_rope_loads, _norm_rope_values, _norm_weights, _rope_lanes, _store_kv_row,
)


@triton.jit
def _attention_prologue_kernel(
    projected,
    q_norm_weight,
    k_norm_weight,
    inv_freq,
    positions,
    k_cache,
    v_cache,
    slot_mapping,
    q_out,  # contiguous [T, Hq, D]
    eps,
    stride_p_t,
    stride_p_c,
    stride_k_block,
    stride_k_offset,
    stride_k_head,
    stride_k_dim,
    stride_v_block,
    stride_v_offset,
    stride_v_head,
    stride_v_dim,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_P: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
    ROTARY_HALF: tl.constexpr,  # len(inv_freq): channels [0, 2 * ROTARY_HALF) are rotated
    BLOCK_SIZE: tl.constexpr,
):
    K_START = 2 * NUM_Q_HEADS * HEAD_DIM  # [q_gate | k | v]
    V_START = K_START + NUM_KV_HEADS * HEAD_DIM
    token = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    dtype = q_out.dtype.element_ty
    offs_d, d_mask, rot_mask, partner = _rope_lanes(HEAD_DIM, HEAD_DIM_P, ROTARY_HALF)
    row = projected + token * stride_p_t
    freq = tl.load(inv_freq + offs_d % ROTARY_HALF, mask=rot_mask, other=0.0)  # emb = cat(freqs, freqs)
    cos, sin = _cos_sin(tl.load(positions + token), freq, dtype)

    offs_g = tl.arange(0, GROUP_P)
    g_mask = offs_g < GROUP
    heads = kv_head * GROUP + offs_g
    q_w, q_w_partner = _norm_weights(q_norm_weight, offs_d, d_mask, partner, rot_mask)
    k_w, k_w_partner = _norm_weights(k_norm_weight, offs_d, d_mask, partner, rot_mask)
    slot = tl.load(slot_mapping + token).to(tl.int64)
    # q's, k's and v's loads before either norm's reduction (after it, each would wait for the one before)
    one_row = tl.arange(0, 1)  # k and v as [1, HEAD_DIM_P] rows
    q_x, q_xp = _norm_rope_loads(row, heads * (2 * HEAD_DIM), g_mask, offs_d, d_mask, partner, rot_mask, stride_p_c)
    k_x, k_xp = _norm_rope_loads(row, K_START + kv_head * HEAD_DIM + one_row, one_row < 1, offs_d, d_mask, partner,
                                 rot_mask, stride_p_c)
    v = tl.load(row + (V_START + kv_head * HEAD_DIM + offs_d[None, :]) * stride_p_c, mask=d_mask[None, :], other=0.0)
    q = _norm_rope_values(q_x, q_xp, q_w, q_w_partner, cos, sin, eps, offs_d, rot_mask, HEAD_DIM, ROTARY_HALF, dtype)
    tl.store(q_out + (token * NUM_Q_HEADS + heads[:, None]) * HEAD_DIM + offs_d[None, :], q,
             mask=g_mask[:, None] & d_mask[None, :])
    k = _norm_rope_values(k_x, k_xp, k_w, k_w_partner, cos, sin, eps, offs_d, rot_mask, HEAD_DIM, ROTARY_HALF, dtype)
    _store_kv_row(k_cache, v_cache, slot, kv_head, k, v, offs_d, d_mask, stride_k_block, stride_k_offset,
                  stride_k_head, stride_k_dim, stride_v_block, stride_v_offset, stride_v_head, stride_v_dim, BLOCK_SIZE)


def attention_prologue(
    projected: torch.Tensor,  # [T, P]: [q_gate | k | v]
    q_norm_weight: torch.Tensor,
    k_norm_weight: torch.Tensor,
    eps: float,
    inv_freq: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    tokens = projected.shape[0]
    q = projected.new_empty(tokens, num_heads, head_dim)
    if tokens == 0:
        return q
    group = num_heads // num_kv_heads
    q_norm_weight, k_norm_weight, inv_freq = unit_stride(q_norm_weight, k_norm_weight, inv_freq)
    positions, slot_mapping = unit_stride(positions, slot_mapping)
    _attention_prologue_kernel[(tokens, num_kv_heads)](
        projected,
        q_norm_weight,
        k_norm_weight,
        inv_freq,
        positions,
        k_cache,
        v_cache,
        slot_mapping,
        q,
        eps,
        *projected.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        NUM_Q_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        GROUP=group,
        GROUP_P=triton.next_power_of_2(group),
        HEAD_DIM=head_dim,
        HEAD_DIM_P=triton.next_power_of_2(head_dim),
        ROTARY_HALF=inv_freq.shape[0],
        BLOCK_SIZE=k_cache.shape[1],
        num_warps=4,
    )
    return q
