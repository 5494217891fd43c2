"""Triton kernel for ``ce::gated_deltanet_decode``: a Gated DeltaNet layer's decode step between its two GEMMs.

Why: at decode batch 1 the unfused path launches ~5 small kernels per linear layer between in_proj and out_proj (the
copy making ``a``/``b`` contiguous, the conv decode, the delta-rule decode, the gated RMSNorm), a few µs each, mostly
launch latency. This kernel does all of it in one launch, reading q, k, v, z, b and a straight from the in_proj output
row by offset (no split copies) and writing the normed output that out_proj reads.

Grid ``(batch, key head)``. Program (b, h) owns a DISJOINT set of conv channels and recurrent-state heads: the K
q-channels of key head h, its K k-channels, the v-channels of its value heads ``h*G .. h*G + G - 1`` (G = Hv / Hk;
value head j reads key head j // G, repeat_interleave), and those value heads' ``[K, V]`` state tiles. So:
  * conv: a program loads the history of its channels, ``tl.debug_barrier()``, then writes the shifted history in
    place (the barrier orders the program's own threads, as in ``_conv_decode_kernel``); no other program reads or
    writes these channels of this slot, so programs cannot race;
  * recurrent state: each ``[K, V]`` tile is read and written by one program only, and its store depends on
    ``u = (v - S^T k) * beta``, a reduction over the whole loaded tile, so every read precedes every write;
  * padding lanes all point at the null slot 0 and race with each other there by design: nobody reads slot 0.
Each program computes q and k once (conv + SiLU + l2norm) and reuses them for its G value heads, which it walks in
turn (``tl.static_range``): per head, S *= exp(g); u = (v - S^T k) * beta; S += k (x) u; o = S^T q; store S; then
the gated RMSNorm of o over V with ``silu(z)`` and the shared weight, stored at ``out[b, j*V:(j+1)*V]``.
Loads come before any math. With PDL, what does not depend on in_proj's output (the slot, the conv history and
the first value head's state tile: written in a step by this kernel only) is loaded before ``gdc_wait``, while
in_proj still runs; after it a program waits for one round trip to memory (the projected row), not one per step of
the math.

Rounding follows the unfused references exactly: conv outputs cast to projected's dtype (the conv op's output),
the delta-rule output cast to it (the delta op's output), the normalised output cast to it and, as torch would,
the weight product rounded to ``promote_types(norm_weight, projected)``; state math is fp32.

Registers: the whole ``[BLOCK_K, BLOCK_V]`` fp32 tile (128 x 128 = 16K values at the model shapes) lives in
registers, hence ``num_warps=8`` by default (64 tile values a thread). At 8 warps the kernel sits at the
255-register limit with few or no spills: issuing every load up front keeps more values live than math order would,
the price of one round trip to memory at batch 1 instead of four; 16 warps hit the 128-register cap and spill; 4
warps cannot hold the tile (bench/NOTES.md, "Decode kernels' registers"). Above 128 registers a thread, one 8-warp
program is resident per SM either way. At batch 1 the grid is only Hk programs (16 for Qwen3.5-0.8B): the launches
saved, not bandwidth, are the point there; at large batch the unfused delta-rule kernel (a ``[128, 64]`` tile, 4
warps, up to 3 programs an SM) streams the state faster, hence ``FUSED_MAX_BATCH``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.layouts import check_gated_deltanet_decode_args, gated_deltanet_split_sizes
from ops.triton import conv1d_kernels, delta_rule_kernels, norm_kernels
from ops.triton.conv1d_kernels import conv_apply, conv_load, store_history
from ops.triton.delta_rule_kernels import L2NORM_EPS, decay_and_beta
from ops.triton.pdl import pdl_flags

# Sequences up to which the fused kernel runs; above, the unfused kernels (conv, delta rule, norm: 3 launches). At
# small batch the launches are the cost, at large batch the state traffic, where the unfused delta-rule kernel's
# [K, 64] tiles keep up to 3 programs an SM streaming: the fused kernel is the faster at 8 sequences and the slower
# at 64 (bench/NOTES.md, "Fused GDN decode").
FUSED_MAX_BATCH = 16


@triton.jit
def _gated_deltanet_decode_kernel(
    projected,
    conv_weight,
    conv_state,
    A_log,
    dt_bias,
    norm_weight,
    recurrent_state,
    state_slots,
    out,  # contiguous [B, Hv * V]
    scale,  # K ** -0.5
    eps,  # the gated RMSNorm's
    stride_p_b,
    stride_p_c,
    stride_w_c,
    stride_w_k,
    stride_cs_slot,
    stride_cs_c,
    stride_cs_k,
    stride_rs_slot,
    stride_rs_h,
    stride_rs_k,
    stride_rs_v,
    NUM_K_HEADS: tl.constexpr,
    NUM_V_HEADS: tl.constexpr,
    GROUP: tl.constexpr,  # NUM_V_HEADS // NUM_K_HEADS
    DK: tl.constexpr,
    DV: tl.constexpr,
    WIDTH: tl.constexpr,
    HIST_P: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    ROUND_WEIGHT_PRODUCT: tl.constexpr,  # norm_weight * normed rounds to projected's dtype (torch's promotion)
    USE_PDL: tl.constexpr,  # ops/triton/pdl.py: out_proj's weight loads may start while this kernel runs
):
    KEY_DIM = NUM_K_HEADS * DK
    VALUE_DIM = NUM_V_HEADS * DV
    Z_START = 2 * KEY_DIM + VALUE_DIM  # [q | k | v | z | b | a]
    B_START = Z_START + VALUE_DIM
    A_START = B_START + NUM_V_HEADS

    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
    seq = tl.program_id(0).to(tl.int64)
    k_head = tl.program_id(1)
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.arange(0, BLOCK_V)
    k_mask = offs_k < DK
    v_mask = offs_v < DV
    tile_mask = k_mask[:, None] & v_mask[None, :]
    dtype = out.dtype.element_ty

    # Before the wait (with PDL, while in_proj still runs): everything that does not depend on in_proj's output.
    # Besides the weights (ops/triton/pdl.py), that is this sequence's slot (a step input, copied in before the
    # step's first kernel) and its conv history and recurrent state in this layer, which no kernel of the step but
    # this one writes. The first value head's state tile (the long pole) and windows are loaded here; the rest of a
    # group's heads (GROUP > 1) after the wait. Then only the projected row is left to fetch: one round trip.
    norm_w = tl.load(norm_weight + offs_v, mask=v_mask, other=0.0).to(tl.float32)
    slot = tl.load(state_slots + seq).to(tl.int64)
    conv_rows = conv_state + slot * stride_cs_slot
    state_heads = (recurrent_state + slot * stride_rs_slot + offs_k[:, None] * stride_rs_k
                   + offs_v[None, :] * stride_rs_v)
    q_channels = k_head * DK + offs_k
    k_channels = KEY_DIM + k_head * DK + offs_k
    q_rows = conv_rows + q_channels * stride_cs_c
    k_rows = conv_rows + k_channels * stride_cs_c
    q_hist, q_shifted, q_w_hist, q_w_new = conv_load(conv_weight, q_rows, q_channels, k_mask, stride_w_c, stride_w_k,
                                                     stride_cs_k, WIDTH, HIST_P)
    k_hist, k_shifted, k_w_hist, k_w_new = conv_load(conv_weight, k_rows, k_channels, k_mask, stride_w_c, stride_w_k,
                                                     stride_cs_k, WIDTH, HIST_P)
    first_v_head = k_head * GROUP
    s_first = tl.load(state_heads + first_v_head * stride_rs_h, mask=tile_mask, other=0.0).to(tl.float32)
    v_channels = 2 * KEY_DIM + first_v_head * DV + offs_v
    v_hist, v_shifted, v_w_hist, v_w_new = conv_load(conv_weight, conv_rows + v_channels * stride_cs_c, v_channels,
                                                     v_mask, stride_w_c, stride_w_k, stride_cs_k, WIDTH, HIST_P)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()  # in_proj's output (projected) is read after this
    row = projected + seq * stride_p_b

    for j in tl.static_range(GROUP):
        v_head = first_v_head + j
        tile = state_heads + v_head * stride_rs_h
        v_channels = 2 * KEY_DIM + v_head * DV + offs_v
        v_rows = conv_rows + v_channels * stride_cs_c
        if j == 0:
            s = s_first
        else:  # loads first: nothing before the barrier below waits on a load
            s = tl.load(tile, mask=tile_mask, other=0.0).to(tl.float32)
            v_hist, v_shifted, v_w_hist, v_w_new = conv_load(conv_weight, v_rows, v_channels, v_mask, stride_w_c,
                                                             stride_w_k, stride_cs_k, WIDTH, HIST_P)
        a_val = tl.load(row + (A_START + v_head) * stride_p_c)
        b_val = tl.load(row + (B_START + v_head) * stride_p_c)
        A_log_val = tl.load(A_log + v_head)
        dt_bias_val = tl.load(dt_bias + v_head)
        z = tl.load(row + (Z_START + v_head * DV + offs_v) * stride_p_c, mask=v_mask, other=0.0).to(tl.float32)
        if j == 0:  # q and k of this key head, shared by its value heads: conv + SiLU (l2norm below)
            q, q_history = conv_apply(row, q_channels, k_mask, stride_p_c, q_hist, q_shifted, q_w_hist, q_w_new,
                                      WIDTH, HIST_P)
            k, k_history = conv_apply(row, k_channels, k_mask, stride_p_c, k_hist, k_shifted, k_w_hist, k_w_new,
                                      WIDTH, HIST_P)
        v, v_history = conv_apply(row, v_channels, v_mask, stride_p_c, v_hist, v_shifted, v_w_hist, v_w_new, WIDTH,
                                  HIST_P)
        tl.debug_barrier()  # every conv-history read of this program happens before any history write below
        if j == 0:
            store_history(q_rows, k_mask, q_history, stride_cs_k, WIDTH, HIST_P)
            store_history(k_rows, k_mask, k_history, stride_cs_k, WIDTH, HIST_P)
            q = q * tl.rsqrt(tl.sum(q * q, 0) + L2NORM_EPS) * scale  # l2norm in fp32, q scaled by K**-0.5
            k = k * tl.rsqrt(tl.sum(k * k, 0) + L2NORM_EPS)
        store_history(v_rows, v_mask, v_history, stride_cs_k, WIDTH, HIST_P)

        decay, beta = decay_and_beta(a_val, b_val, A_log_val, dt_bias_val)
        s = s * decay  # S *= exp(g)
        u = (v - tl.sum(s * k[:, None], 0)) * beta  # u = (v - S^T k) beta
        s = s + k[:, None] * u[None, :]  # S += k (x) u
        o = tl.sum(s * q[:, None], 0)  # o = S^T q, after the update
        tl.store(tile, s.to(recurrent_state.dtype.element_ty), mask=tile_mask)

        # Gated RMSNorm over V, rounded where the unfused path rounds (ops/norm.py rms_norm_reference).
        o = o.to(dtype).to(tl.float32)  # the delta-rule op's output, in v's dtype
        rstd = tl.rsqrt(tl.sum(o * o, 0) / DV + eps)
        scaled = norm_w * (o * rstd).to(dtype).to(tl.float32)
        if ROUND_WEIGHT_PRODUCT:
            scaled = scaled.to(dtype).to(tl.float32)
        y = scaled * (z * tl.sigmoid(z))
        tl.store(out + seq * VALUE_DIM + v_head * DV + offs_v, y.to(dtype), mask=v_mask)


def gated_deltanet_decode(
    projected: torch.Tensor,  # [B, P]: [q | k | v | z | b | a], last dim contiguous
    conv_weight: torch.Tensor,  # [C, W]
    conv_state: torch.Tensor,  # [S, C, W-1]  (written at state_slots)
    A_log: torch.Tensor,  # [Hv]
    dt_bias: torch.Tensor,  # [Hv]
    norm_weight: torch.Tensor,  # [V]
    recurrent_state: torch.Tensor,  # [S, Hv, K, V]  (written at state_slots)
    state_slots: torch.Tensor,  # [B] int32
    num_k_heads: int,
    head_k_dim: int,
    num_v_heads: int,
    head_v_dim: int,
    eps: float,
    num_warps: int = 8,
    fused: bool | None = None,
) -> torch.Tensor:
    """The fused kernel up to ``FUSED_MAX_BATCH`` sequences (or as ``fused`` says), the unfused kernels above."""
    check_gated_deltanet_decode_args(projected, conv_weight, num_k_heads, head_k_dim, num_v_heads, head_v_dim)
    batch = projected.shape[0]
    width = conv_weight.shape[1]
    if not (batch <= FUSED_MAX_BATCH if fused is None else fused):
        return _unfused(projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, recurrent_state, state_slots,
                        num_k_heads, head_k_dim, num_v_heads, head_v_dim, eps)
    out = torch.empty((batch, num_v_heads * head_v_dim), dtype=projected.dtype, device=projected.device)
    if batch == 0:
        return out
    norm_weight = norm_weight.contiguous()  # [V]: a no-op for a parameter
    _gated_deltanet_decode_kernel[(batch, num_k_heads)](
        projected,
        conv_weight,
        conv_state,
        A_log,
        dt_bias,
        norm_weight,
        recurrent_state,
        state_slots,
        out,
        head_k_dim**-0.5,
        eps,
        *projected.stride(),
        *conv_weight.stride(),
        *conv_state.stride(),
        *recurrent_state.stride(),
        NUM_K_HEADS=num_k_heads,
        NUM_V_HEADS=num_v_heads,
        GROUP=num_v_heads // num_k_heads,
        DK=head_k_dim,
        DV=head_v_dim,
        WIDTH=width,
        HIST_P=triton.next_power_of_2(width - 1),
        BLOCK_K=triton.next_power_of_2(head_k_dim),
        BLOCK_V=triton.next_power_of_2(head_v_dim),
        ROUND_WEIGHT_PRODUCT=torch.promote_types(norm_weight.dtype, projected.dtype) == projected.dtype,
        num_warps=num_warps,
        **pdl_flags(projected),
    )
    return out


def _unfused(projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, recurrent_state, state_slots,
             num_k_heads, head_k_dim, num_v_heads, head_v_dim, eps) -> torch.Tensor:
    """The same result from the unfused decode kernels (conv, delta rule, gated norm: the reference's pieces),
    reading their inputs as strided views of ``projected`` (no copies)."""
    batch = projected.shape[0]
    q_width, k_width, v_width, z_width, b_width, _ = gated_deltanet_split_sizes(num_k_heads, head_k_dim,
                                                                                 num_v_heads, head_v_dim)
    channels = q_width + k_width + v_width
    mixed = conv1d_kernels.causal_conv1d_decode(projected[:, :channels], conv_weight, conv_state, state_slots)
    q, k, v = mixed.split([q_width, k_width, v_width], dim=-1)
    z_start = channels
    b_start = z_start + z_width
    a = projected[:, b_start + b_width:]
    b = projected[:, b_start:b_start + b_width]
    o = delta_rule_kernels.gated_delta_rule_decode(
        q.view(batch, num_k_heads, head_k_dim), k.view(batch, num_k_heads, head_k_dim),
        v.view(batch, num_v_heads, head_v_dim), a, b, A_log, dt_bias, recurrent_state, state_slots,
    )
    z = projected[:, z_start:z_start + z_width].view(batch, num_v_heads, head_v_dim)
    return norm_kernels.rms_norm(o, norm_weight, z, eps, False).view(batch, -1)
