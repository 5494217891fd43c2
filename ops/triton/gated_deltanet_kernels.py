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
    writes these channels of this slot, so programs cannot race (but with ``SPLIT_V``, below: there the key head's
    programs share the q and k channels);
  * recurrent state: each ``[K, V]`` tile is read and written by one program only, and its store depends on
    ``u = (v - S^T k) * beta``, a reduction over the whole loaded tile, so every read precedes every write;
  * padding lanes all point at the null slot 0: their recurrent state is neither read (zeros) nor written (the
    op's rule: a padding lane moves none of its 1 MiB a layer), and their conv history writes race with each other
    there by design: nobody reads slot 0 but padding lanes.
Each program computes q and k once (conv + SiLU + l2norm) and reuses them for its G value heads, which it walks in
turn (``tl.static_range``): per head, S *= exp(g); u = (v - S^T k) * beta; S += k (x) u; o = S^T q; store S; then
the gated RMSNorm of o over V with ``silu(z)`` and the shared weight, stored at ``out[b, j*V:(j+1)*V]``. Every
column of S is independent of the others but for the norm, so a program may also walk a head in ``[K, BLOCK_V]``
tiles (``V_BLOCKS`` > 1): each tile's rounded o is parked in ``out``, and once the head's last tile is done
(``tl.debug_barrier()``: the program's global stores are visible to all its threads) the norm reads the parked
outputs back and overwrites them with the normed ones.
With ``SPLIT_V`` the grid is ``(batch, key head, V block)`` instead: each program takes one V block of each of the
key head's G value heads, so a head's state is streamed by V_BLOCKS programs at once (at batch 1 the plain grid has
only Hk programs). Two things are then shared between the key head's programs: q and k's conv history, which every
one of them reads, and each value head's gated norm, which needs all its V blocks. So no program writes the q/k
history or normalises as it goes: each parks its rounded outputs in ``out``, then counts itself in (one atomic add
per program on ``counters[b * Hk + h]``, after a barrier, acquire-release at GPU scope: its history reads and
parked stores come before it), and the program that makes the count V_BLOCKS, the last, writes the q/k history,
reads every parked output back past L1 (the others' stores) to normalise each value head, and sets the count back
to zero for the next launch (``split_counters``: one zeroed buffer a device).
Loads come before any math. With PDL, what does not depend on in_proj's output (the slot, the conv history and
the first value head's first state tile: written in a step by this kernel only) is loaded before ``gdc_wait``,
while in_proj still runs; after it a program waits for one round trip to memory (the projected row), not one per
step of the math. Over a walk of several tiles (V tiles, or G > 1 value heads), each tile's loads (state tile, its
v-channels' conv history, weights and inputs, the head's a, b, A_log, dt_bias, z) are issued before the previous
tile's math and stores (``PREFETCH``, per launch in ``DECODE_LAUNCHES``), as the verify kernel does for its
positions: a load after a store stays after it (the compiler does not know they cannot alias), so in walk order each
tile would wait a round trip before its loads even issue. The price is a second tile live in registers.

Rounding follows the unfused references exactly: conv outputs cast to projected's dtype (the conv op's output),
the delta-rule output cast to it (the delta op's output), the normalised output cast to it and, as torch would,
the weight product rounded to ``promote_types(norm_weight, projected)``; state math is fp32.

Registers: a whole head's ``[BLOCK_K, BLOCK_V]`` fp32 tile (128 x 128 = 16K values at the model shapes) lives in
registers with ``num_warps=8`` (64 tile values a thread). At 8 warps the kernel sits at the 255-register limit with
few or no spills: issuing every load up front keeps more values live than math order would, the price of one round
trip to memory at batch 1 instead of four; 16 warps hit the 128-register cap and spill; 4 warps cannot hold the tile
(bench/NOTES.md, "Decode kernels' registers"). Above 128 registers a thread, one 8-warp program is resident per SM
either way. Tiles of 64 take 254 registers at 8 warps; tiles of 32 at 4 warps 246 (two programs an SM); tiles of 64
at 4 warps spill kilobytes (Triton 3.9's ptxas, sm_90). At batch 1 the grid is only Hk programs (16 for
Qwen3.5-0.8B): the launches saved, not bandwidth, are the point there; past 256 sequences the unfused delta-rule
kernel (a ``[128, 64]`` tile, 4 warps) is left to stream the state, hence ``DECODE_LAUNCHES``. The figures above are for
every stride a runtime i64 (tests/test_kernels_compile_sm90.py's ``GDN_SIG``); launched, Triton specializes the unit
strides to constants (vector loads) and the others to i32, and the kernel takes fewer (Triton 3.6, sm_90, the
model's strides, without / with ``PREFETCH``; G = 1 and G = 2): whole heads at 8 warps 170 / 170 and 222 / 255,
tiles of 64 at 8 warps 111 / 146 and 128 / 192, tiles of 32 at 4 warps 122 / 163 and 128 / 196, no spills. The
prefetch thus costs the tiles programs an SM (8 warps: 2 -> 1; 4 warps: 4 -> 3 at G = 1, 4 -> 2 at G = 2).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ops.layouts import (
    check_gated_deltanet_decode_args, check_gated_deltanet_verify_args, gated_deltanet_split_sizes,
)
from ops.library import DEVICE_BUFFERS
from ops.triton import conv1d_kernels, delta_rule_kernels, norm_kernels, unit_stride
from ops.triton.conv1d_kernels import conv_load, conv_step, store_history
from ops.triton.delta_rule_kernels import L2NORM_EPS, decay_and_beta, state_rows
from ops.triton.pdl import pdl_flags

# The decode launch by batch size, first match wins: (most sequences, the fused kernel's V tile or None for whole heads
# in registers, warps, prefetch, split); above the last entry, the unfused kernels (conv, delta rule, norm: 3 launches).
# Timed on Qwen3.5-0.8B's shape (16 value heads of 128 x 128), one call per CUDA graph (bench/NOTES.md, "Fused GDN
# decode"): up to 4 sequences V tiles of 32 at 4 warps over programs (``SPLIT_V``: the state streams through Hk x V
# blocks programs instead of Hk, where a small batch has few) lead whole heads (level at 8, behind at 16); whole heads
# at 8 warps (one program an SM) lead the walked tiles while the batch x key heads programs fit one wave; at 9-16
# sequences V tiles of 32 (4 warps) walked with the prefetch lead tiles of 64 (8 warps), alone and in the decode graph,
# and those whole heads; from 32 tiles of 32 (4 warps, no spills, two programs an SM) beat whole heads by 7-9% at 32-64
# and the unfused kernels at every batch timed: by 10-22% at 32-64, 7.6% at 128 and 2.4% at 256 (49.0 / 91.5 / 175.6 µs
# against 58.0 / 99.0 / 179.8 at 64 / 128 / 256). Past 256 (untimed with the tiles in walk order) the unfused kernels.
# The fourth field: each tile's loads issued before the previous tile's math and stores (the kernel's ``PREFETCH``; it
# acts only where a program walks several tiles: V tiles, or G > 1 value heads). Off for the tiles from 17 sequences:
# the second tile in registers costs them programs an SM, and one call per graph they lost with it by 7-14% at 32-256
# sequences (at 16 tiles of 32 gained 4% with it, tiles of 64 lost 6%). On for whole heads, where it costs no occupancy
# (one program an SM either way) and acts only at G > 1 (not timed on a G > 1 shape yet).
DECODE_LAUNCHES = ((4, 32, 4, False, True), (8, None, 8, True, False), (16, 32, 4, True, False),
                   (256, 32, 4, False, False))
SPLIT_COUNTERS = 64 * 64  # SPLIT_V's per-device counts (sequences x key heads) made up front: it serves small batches


def decode_config(batch: int) -> tuple[bool, int | None, int, bool, bool]:
    """(fused, block_v, num_warps, prefetch, split_v) of the decode launch for ``batch`` sequences
    (``DECODE_LAUNCHES``); past its last entry the unfused kernels (where a fused launch, if asked for, uses the last
    entry's tiles)."""
    for most, block_v, warps, prefetch, split_v in DECODE_LAUNCHES:
        if batch <= most:
            return True, block_v, warps, prefetch, split_v
    _, block_v, warps, prefetch, split_v = DECODE_LAUNCHES[-1]
    return False, block_v, warps, prefetch, split_v


_counters: dict[torch.device, torch.Tensor] = {}


def split_counters(device: torch.device, count: int = SPLIT_COUNTERS) -> torch.Tensor:
    """The ``SPLIT_V`` launch's per-(sequence, key head) counts on ``device``, at least ``count`` of them: int32
    zeros that every launch leaves zero (the last program of each key head resets its count), so one buffer serves
    every layer and step in stream order (one stream a device: the decode graphs'). Made by
    ``ops.library.prepare_device``, which the graph runners call before compiling; made or grown during a capture it
    would live in the graph's memory pool, so that raises."""
    if device not in _counters or _counters[device].numel() < count:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"the split GDN decode's counts ({count}) were not made before this CUDA-graph capture: "
                               f"call ops.library.prepare_device first")
        _counters[device] = torch.zeros(max(count, SPLIT_COUNTERS), dtype=torch.int32, device=device)
    return _counters[device]


DEVICE_BUFFERS.append(split_counters)


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
    counters,  # SPLIT_V: int32 [>= B * Hk], zero, left zero (the last program of each key head resets its count)
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
    BLOCK_V: tl.constexpr,  # a power of two; V_BLOCKS of them cover DV
    V_BLOCKS: tl.constexpr,
    WALK_BLOCKS: tl.constexpr,  # V blocks a program walks per value head: V_BLOCKS, or 1 with SPLIT_V
    SPLIT_V: tl.constexpr,  # grid (B, Hk, V_BLOCKS): the head's V blocks over programs (see the module docstring)
    BLOCK_HEAD: tl.constexpr,  # next_power_of_2(DV): the norm's vector when the head is walked in tiles
    ROUND_WEIGHT_PRODUCT: tl.constexpr,  # norm_weight * normed rounds to projected's dtype (torch's promotion)
    USE_PDL: tl.constexpr,  # ops/triton/pdl.py: out_proj's weight loads may start while this kernel runs
    PREFETCH: tl.constexpr,  # each tile's loads issued before the previous tile's math and stores (see above)
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
    first_block = tl.program_id(2) if SPLIT_V else 0  # SPLIT_V: this program's V block of each value head
    offs_k = tl.arange(0, BLOCK_K)
    k_mask = offs_k < DK
    dtype = out.dtype.element_ty
    out_row = out + seq * VALUE_DIM

    # Before the wait (with PDL, while in_proj still runs): everything that does not depend on in_proj's output.
    # Besides the weights (ops/triton/pdl.py), that is this sequence's slot (a step input, copied in before the
    # step's first kernel) and its conv history and recurrent state in this layer, which no kernel of the step but
    # this one writes. The first value head's first state tile (the long pole) and window are loaded here; the rest
    # after the wait. Then only the projected row is left to fetch: one round trip.
    slot = tl.load(state_slots + seq).to(tl.int64)
    conv_rows = conv_state + slot * stride_cs_slot
    state_heads = recurrent_state + slot * stride_rs_slot + offs_k[:, None] * stride_rs_k
    state_mask = state_rows(offs_k, slot, DK)  # the state tiles' rows: none for a padding lane
    q_channels = k_head * DK + offs_k
    k_channels = KEY_DIM + k_head * DK + offs_k
    q_rows = conv_rows + q_channels * stride_cs_c
    k_rows = conv_rows + k_channels * stride_cs_c
    q_hist, q_shifted, q_w_hist, q_w_new = conv_load(conv_weight, q_rows, q_channels, k_mask, stride_w_c, stride_w_k,
                                                     stride_cs_k, WIDTH, HIST_P)
    k_hist, k_shifted, k_w_hist, k_w_new = conv_load(conv_weight, k_rows, k_channels, k_mask, stride_w_c, stride_w_k,
                                                     stride_cs_k, WIDTH, HIST_P)
    first_v_head = k_head * GROUP
    offs_v = tl.arange(0, BLOCK_V)
    norm_w = tl.load(norm_weight + offs_v, mask=offs_v < DV, other=0.0).to(tl.float32)  # V_BLOCKS == 1: the whole head
    pool = _tile_pool_loads(conv_weight, conv_rows, state_heads, A_log, dt_bias, state_mask, first_v_head, first_block,
                            stride_w_c, stride_w_k, stride_cs_c, stride_cs_k, stride_rs_h, stride_rs_v, 2 * KEY_DIM, DV,
                            BLOCK_V, WIDTH, HIST_P)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()  # in_proj's output (projected) is read after this
    row = projected + seq * stride_p_b
    inputs = _tile_row_loads(row, first_v_head, first_block, stride_p_c, 2 * KEY_DIM, Z_START, B_START, A_START, DV,
                             BLOCK_V, V_BLOCKS == 1)
    # q and k's new inputs with the first tile's: loaded after q's conv, k's would wait for its reduction's barrier
    x_q = tl.load(row + q_channels * stride_p_c, mask=k_mask, other=0.0)
    x_k = tl.load(row + k_channels * stride_p_c, mask=k_mask, other=0.0)

    for j in tl.static_range(GROUP):
        v_head = first_v_head + j
        sum_sq = 0.0  # of the head's rounded outputs, over its V blocks (V_BLOCKS > 1 walked by this program)
        for vb in tl.static_range(WALK_BLOCKS):
            block = first_block + vb
            if j + vb > 0 and not PREFETCH:  # this tile's loads, after the previous tile's stores
                pool = _tile_pool_loads(conv_weight, conv_rows, state_heads, A_log, dt_bias, state_mask, v_head, block,
                                        stride_w_c, stride_w_k, stride_cs_c, stride_cs_k, stride_rs_h, stride_rs_v,
                                        2 * KEY_DIM, DV, BLOCK_V, WIDTH, HIST_P)
                inputs = _tile_row_loads(row, v_head, block, stride_p_c, 2 * KEY_DIM, Z_START, B_START, A_START, DV,
                                         BLOCK_V, V_BLOCKS == 1)
            s, v_hist, v_shifted, v_w_hist, v_w_new, A_log_val, dt_bias_val = pool
            x_v, a_val, b_val, z = inputs
            if PREFETCH and (vb + 1 < WALK_BLOCKS or j + 1 < GROUP):  # the next tile's loads now: see the docstring
                next_head = v_head + (vb + 1) // WALK_BLOCKS
                next_block = first_block + (vb + 1) % WALK_BLOCKS
                pool = _tile_pool_loads(conv_weight, conv_rows, state_heads, A_log, dt_bias, state_mask, next_head,
                                        next_block, stride_w_c, stride_w_k, stride_cs_c, stride_cs_k, stride_rs_h,
                                        stride_rs_v, 2 * KEY_DIM, DV, BLOCK_V, WIDTH, HIST_P)
                inputs = _tile_row_loads(row, next_head, next_block, stride_p_c, 2 * KEY_DIM, Z_START, B_START,
                                         A_START, DV, BLOCK_V, V_BLOCKS == 1)
            offs_v, v_mask, v_channels = _tile_columns(v_head, block, 2 * KEY_DIM, DV, BLOCK_V)
            if j + vb == 0:  # q and k of this key head, shared by its value heads: conv + SiLU, l2norm below
                q, q_history = conv_step(x_q, q_hist, q_shifted, q_w_hist, q_w_new, WIDTH, HIST_P)
                k, k_history = conv_step(x_k, k_hist, k_shifted, k_w_hist, k_w_new, WIDTH, HIST_P)
            v, v_history = conv_step(x_v, v_hist, v_shifted, v_w_hist, v_w_new, WIDTH, HIST_P)
            tl.debug_barrier()  # every conv-history read of these channels happens before any history write below
            if j + vb == 0:
                if not SPLIT_V:  # (SPLIT_V: the head's last program to finish writes them, below)
                    store_history(q_rows, k_mask, q_history, stride_cs_k, WIDTH, HIST_P)
                    store_history(k_rows, k_mask, k_history, stride_cs_k, WIDTH, HIST_P)
                q = q * tl.rsqrt(tl.sum(q * q, 0) + L2NORM_EPS) * scale  # l2norm in fp32, q scaled by K**-0.5
                k = k * tl.rsqrt(tl.sum(k * k, 0) + L2NORM_EPS)
            store_history(conv_rows + v_channels * stride_cs_c, v_mask, v_history, stride_cs_k, WIDTH, HIST_P)

            decay, beta = decay_and_beta(a_val, b_val, A_log_val, dt_bias_val)
            s = s * decay  # S *= exp(g)
            u = (v - tl.sum(s * k[:, None], 0)) * beta  # u = (v - S^T k) beta
            s = s + k[:, None] * u[None, :]  # S += k (x) u
            o = tl.sum(s * q[:, None], 0)  # o = S^T q, after the update
            tl.store(state_heads + v_head * stride_rs_h + offs_v[None, :] * stride_rs_v,
                     s.to(recurrent_state.dtype.element_ty), mask=state_mask[:, None] & v_mask[None, :])
            o = o.to(dtype).to(tl.float32)  # the delta-rule op's output, in v's dtype
            if V_BLOCKS == 1:  # the whole head in registers: the gated norm right here
                y = _gated_norm(o, tl.rsqrt(tl.sum(o * o, 0) / DV + eps), z, norm_w, dtype, ROUND_WEIGHT_PRODUCT)
                tl.store(out_row + v_head * DV + offs_v, y, mask=v_mask)
            else:  # park the rounded output where the normed one goes; the norm needs the whole head
                tl.store(out_row + v_head * DV + offs_v, o.to(dtype), mask=v_mask)
                sum_sq += tl.sum(o * o, 0)
        if V_BLOCKS > 1 and not SPLIT_V:  # the norm over the whole head at once: one round trip, not one a tile
            tl.debug_barrier()  # the parked outputs, stored by any thread of the program, are visible to all of it
            _head_norm(out_row, row, norm_weight, v_head, sum_sq, stride_p_c, Z_START, DV, BLOCK_HEAD, eps, dtype,
                       ROUND_WEIGHT_PRODUCT, False)
    if SPLIT_V:
        # The key head's V_BLOCKS programs count themselves in; the last one (all the others' parked outputs and
        # history reads done before their count: the barrier, then the count's release) writes q and k's history
        # and the gated norm of every value head, and leaves the count at zero for the next launch.
        tl.debug_barrier()  # every thread's stores of this program before the count
        counter = counters + seq * NUM_K_HEADS + k_head
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == V_BLOCKS - 1:
            tl.store(counter, 0)
            store_history(q_rows, k_mask, q_history, stride_cs_k, WIDTH, HIST_P)
            store_history(k_rows, k_mask, k_history, stride_cs_k, WIDTH, HIST_P)
            for j in tl.static_range(GROUP):
                _head_norm(out_row, row, norm_weight, first_v_head + j, 0.0, stride_p_c, Z_START, DV, BLOCK_HEAD, eps,
                           dtype, ROUND_WEIGHT_PRODUCT, True)


@triton.jit
def _head_norm(out_row, row, norm_weight, v_head, sum_sq, stride_p_c, Z_START: tl.constexpr, DV: tl.constexpr,
               BLOCK_HEAD: tl.constexpr, eps, dtype: tl.constexpr, ROUND_WEIGHT_PRODUCT: tl.constexpr,
               FROM_OTHERS: tl.constexpr):
    """The gated norm of value head ``v_head`` from its rounded outputs parked in ``out_row``, written over them.
    ``sum_sq``: their sum of squares, or ``FROM_OTHERS``: parked by other programs too, so read past L1 (another
    program's stores are not in this SM's L1) and the sum taken here."""
    offs_h = tl.arange(0, BLOCK_HEAD)
    h_mask = offs_h < DV
    if FROM_OTHERS:
        o = tl.load(out_row + v_head * DV + offs_h, mask=h_mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        sum_sq = tl.sum(o * o, 0)
    else:
        o = tl.load(out_row + v_head * DV + offs_h, mask=h_mask, other=0.0).to(tl.float32)
    z = tl.load(row + (Z_START + v_head * DV + offs_h) * stride_p_c, mask=h_mask, other=0.0)
    head_w = tl.load(norm_weight + offs_h, mask=h_mask, other=0.0).to(tl.float32)
    y = _gated_norm(o, tl.rsqrt(sum_sq / DV + eps), z, head_w, dtype, ROUND_WEIGHT_PRODUCT)
    tl.debug_barrier()  # every thread has read the parked outputs before any thread overwrites them
    tl.store(out_row + v_head * DV + offs_h, y, mask=h_mask)


@triton.jit
def _tile_columns(v_head, v_block, V_START: tl.constexpr, DV: tl.constexpr, BLOCK_V: tl.constexpr):
    """Columns ``v_block * BLOCK_V ..`` of value head ``v_head``: their offsets in the head, mask, and channels (the
    same index in the conv channels ``[q | k | v]`` and in the projected row, v starting at ``V_START``)."""
    offs_v = v_block * BLOCK_V + tl.arange(0, BLOCK_V)
    return offs_v, offs_v < DV, V_START + v_head * DV + offs_v


@triton.jit
def _tile_pool_loads(conv_weight, conv_rows, state_heads, A_log, dt_bias, state_mask, v_head, v_block, stride_w_c,
                     stride_w_k, stride_cs_c, stride_cs_k, stride_rs_h, stride_rs_v, V_START: tl.constexpr,
                     DV: tl.constexpr, BLOCK_V: tl.constexpr, WIDTH: tl.constexpr, HIST_P: tl.constexpr):
    """The loads of one tile of the decode walk that need nothing of in_proj's (ops/triton/pdl.py): the state tile
    (fp32; its rows ``state_mask``, none for a padding lane), the conv history and weights of its v-channels
    (:func:`conv_load`), and the value head's A_log and dt_bias."""
    offs_v, v_mask, v_channels = _tile_columns(v_head, v_block, V_START, DV, BLOCK_V)
    s = tl.load(state_heads + v_head * stride_rs_h + offs_v[None, :] * stride_rs_v,
                mask=state_mask[:, None] & v_mask[None, :], other=0.0).to(tl.float32)
    v_hist, v_shifted, v_w_hist, v_w_new = conv_load(conv_weight, conv_rows + v_channels * stride_cs_c, v_channels,
                                                     v_mask, stride_w_c, stride_w_k, stride_cs_k, WIDTH, HIST_P)
    return s, v_hist, v_shifted, v_w_hist, v_w_new, tl.load(A_log + v_head), tl.load(dt_bias + v_head)


@triton.jit
def _tile_row_loads(row, v_head, v_block, stride_p_c, V_START: tl.constexpr, Z_START: tl.constexpr,
                    B_START: tl.constexpr, A_START: tl.constexpr, DV: tl.constexpr, BLOCK_V: tl.constexpr,
                    LOAD_Z: tl.constexpr):
    """The loads of one tile of the decode walk from the projected row (:func:`_value_row_loads`); z only with
    ``LOAD_Z`` (the whole head in the tile), else the norm reads the whole head's z after the walk."""
    offs_v, v_mask, v_channels = _tile_columns(v_head, v_block, V_START, DV, BLOCK_V)
    return _value_row_loads(row, v_channels, v_mask, v_head, offs_v, stride_p_c, A_START, B_START, Z_START, DV,
                            LOAD_Z)


@triton.jit
def _value_row_loads(row, v_channels, v_mask, v_head, offs_v, stride_p_c, A_START: tl.constexpr,
                     B_START: tl.constexpr, Z_START: tl.constexpr, DV: tl.constexpr, LOAD_Z: tl.constexpr):
    """What a value head's columns ``offs_v`` (its channels ``v_channels``) read of a projected row: their v inputs,
    the head's a and b, and their z when ``LOAD_Z`` (else a stand-in, not to be used). The decode and verify walks."""
    x_v = tl.load(row + v_channels * stride_p_c, mask=v_mask, other=0.0)
    a_val = tl.load(row + (A_START + v_head) * stride_p_c)
    b_val = tl.load(row + (B_START + v_head) * stride_p_c)
    if LOAD_Z:
        z = tl.load(row + (Z_START + v_head * DV + offs_v) * stride_p_c, mask=v_mask, other=0.0)
    else:
        z = a_val
    return x_v, a_val, b_val, z


@triton.jit
def _gated_norm(o, rstd, z, norm_w, dtype: tl.constexpr, ROUND_WEIGHT_PRODUCT: tl.constexpr):
    """The gated RMSNorm of a value head's rounded output block ``o`` (fp32) given the head's ``rstd`` and the norm
    weight's block ``norm_w`` (fp32), rounded where the unfused path rounds (ops/norm.py rms_norm_reference):
    ``norm_w * (o * rstd)`` then ``* silu(z)``."""
    scaled = norm_w * (o * rstd).to(dtype).to(tl.float32)
    if ROUND_WEIGHT_PRODUCT:
        scaled = scaled.to(dtype).to(tl.float32)
    z = z.to(tl.float32)
    return (scaled * (z * tl.sigmoid(z))).to(dtype)


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
    num_warps: int | None = None,
    fused: bool | None = None,
    block_v: int | None = None,
    prefetch: bool | None = None,
    split_v: bool | None = None,
) -> torch.Tensor:
    """The fused kernel or the unfused ones, with the launch :func:`decode_config` picks for the batch unless
    ``fused`` / ``block_v`` / ``num_warps`` / ``prefetch`` / ``split_v`` say otherwise. ``block_v``: the fused
    kernel's state tile width (a power of two); below V a program walks each value head's tiles in turn (None: the
    whole head), or with ``split_v`` each tile is a program of its own. ``prefetch``: each tile of the walk loaded
    before the previous tile's math and stores."""
    check_gated_deltanet_decode_args(projected, conv_weight, num_k_heads, head_k_dim, num_v_heads, head_v_dim)
    batch = projected.shape[0]
    width = conv_weight.shape[1]
    default_fused, default_block_v, default_warps, default_prefetch, default_split = decode_config(batch)
    if not (default_fused if fused is None else fused):
        return _unfused(projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, recurrent_state, state_slots,
                        num_k_heads, head_k_dim, num_v_heads, head_v_dim, eps)
    block_v = triton.next_power_of_2(min(block_v or default_block_v or head_v_dim, head_v_dim))
    v_blocks = triton.cdiv(head_v_dim, block_v)
    if split_v and v_blocks == 1:
        raise ValueError(f"split_v splits a value head's V tiles over programs: block_v {block_v} covers V = "
                         f"{head_v_dim} in one")
    split_v = (default_split if split_v is None else split_v) and v_blocks > 1
    num_warps = num_warps or default_warps
    out = torch.empty((batch, num_v_heads * head_v_dim), dtype=projected.dtype, device=projected.device)
    if batch == 0:
        return out
    A_log, dt_bias, norm_weight, state_slots = unit_stride(A_log, dt_bias, norm_weight, state_slots)
    _gated_deltanet_decode_kernel[(batch, num_k_heads, v_blocks if split_v else 1)](
        projected,
        conv_weight,
        conv_state,
        A_log,
        dt_bias,
        norm_weight,
        recurrent_state,
        state_slots,
        out,
        split_counters(projected.device, batch * num_k_heads) if split_v else state_slots,  # (unused without SPLIT_V)
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
        BLOCK_V=block_v,
        V_BLOCKS=v_blocks,
        WALK_BLOCKS=1 if split_v else v_blocks,
        SPLIT_V=split_v,
        BLOCK_HEAD=triton.next_power_of_2(head_v_dim),
        ROUND_WEIGHT_PRODUCT=torch.promote_types(norm_weight.dtype, projected.dtype) == projected.dtype,
        PREFETCH=default_prefetch if prefetch is None else prefetch,
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


# ---------------------------------------------------------------------------------------------------------------
# Speculative decoding: ce::gated_deltanet_verify (P positions a sequence, the pools only read) and
# ce::gated_deltanet_commit (the accepted prefix replayed into the pools). ops/gated_deltanet_verify.py has the
# contract; the history entry's layout is ops/layouts.py gated_deltanet_history_offsets.
# ---------------------------------------------------------------------------------------------------------------


@triton.jit
def _window_loads(
    first_row,  # projected + seq * P * stride_p_b: the sequence's first position's row
    state_rows,  # conv_state + slot * stride_cs_slot + channels * stride_cs_c
    channels,
    c_mask,
    position,
    stride_p_b,
    stride_p_c,
    stride_cs_k,
    WIDTH: tl.constexpr,
    WIDTH_P: tl.constexpr,
):
    """The inputs of the causal conv window of ``channels`` at ``position`` of the verify rows, ``[WIDTH_P,
    channels]`` twice: tap j reads the input at ``position - (WIDTH - 1) + j`` from the rows when it is >= 0 (the
    first tensor), else from the (unchanged) conv history (the second); zeros elsewhere. The channels run along the
    threads as the state tile's columns do, so the compiler keeps the tile in its load layout (a [channels, WIDTH_P]
    window made it move the whole tile through shared memory to match the window's)."""
    offs_w = tl.arange(0, WIDTH_P)
    src = position - (WIDTH - 1) + offs_w
    in_rows = (offs_w < WIDTH) & (src >= 0)
    in_state = (offs_w < WIDTH) & (src < 0)
    from_rows = tl.load(first_row + src.to(tl.int64)[:, None] * stride_p_b + channels[None, :] * stride_p_c,
                        mask=in_rows[:, None] & c_mask[None, :], other=0.0)
    from_state = tl.load(state_rows[None, :] + (WIDTH - 1 + src)[:, None] * stride_cs_k,
                         mask=in_state[:, None] & c_mask[None, :], other=0.0)
    return from_rows, from_state


@triton.jit
def _conv_window(from_rows, from_state, weights, STATE_DTYPE: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """silu(causal conv) of a window from :func:`_window_loads` (``weights`` ``[WIDTH_P, channels]`` fp32, zeros
    past WIDTH). Inputs enter the window in the history's dtype, as in the decode op; the output is rounded to
    projected's dtype."""
    window = from_rows.to(STATE_DTYPE).to(tl.float32) + from_state.to(tl.float32)
    acc = tl.sum(window * weights, 0)
    y = acc * tl.sigmoid(acc)
    return y.to(OUT_DTYPE).to(tl.float32)


@triton.jit
def _position_loads(first_row, q_state, k_state, v_state, q_channels, k_channels, v_channels, k_mask, v_mask, v_head,
                    offs_v, position, stride_p_b, stride_p_c, stride_cs_k, A_START: tl.constexpr,
                    B_START: tl.constexpr, Z_START: tl.constexpr, DV: tl.constexpr, WIDTH: tl.constexpr,
                    WIDTH_P: tl.constexpr, LOAD_Z: tl.constexpr):
    """Every load of one position of the verify walk (one value head, one V block): the q / k / v conv windows'
    inputs, the position's own q / k / v inputs (the history's copy), its a and b, and its z when ``LOAD_Z``."""
    row = first_row + position * stride_p_b
    q_rows, q_hist = _window_loads(first_row, q_state, q_channels, k_mask, position, stride_p_b, stride_p_c,
                                   stride_cs_k, WIDTH, WIDTH_P)
    k_rows, k_hist = _window_loads(first_row, k_state, k_channels, k_mask, position, stride_p_b, stride_p_c,
                                   stride_cs_k, WIDTH, WIDTH_P)
    v_rows, v_hist = _window_loads(first_row, v_state, v_channels, v_mask, position, stride_p_b, stride_p_c,
                                   stride_cs_k, WIDTH, WIDTH_P)
    x_q = tl.load(row + q_channels * stride_p_c, mask=k_mask, other=0.0)
    x_k = tl.load(row + k_channels * stride_p_c, mask=k_mask, other=0.0)
    # z not with V blocks (LOAD_Z false): the norm runs in a second launch
    x_v, a_val, b_val, z = _value_row_loads(row, v_channels, v_mask, v_head, offs_v, stride_p_c, A_START, B_START,
                                            Z_START, DV, LOAD_Z)
    return q_rows, q_hist, k_rows, k_hist, v_rows, v_hist, x_q, x_k, x_v, a_val, b_val, z


@triton.jit
def _verify_head_loads(state, tile_mask, conv_rows, conv_weight, A_log, dt_bias, v_head, offs_k, offs_v, v_mask,
                       stride_rs_h, stride_rs_k, stride_rs_v, stride_cs_c, stride_w_c, stride_w_k,
                       KEY_DIM: tl.constexpr, DV: tl.constexpr, WIDTH: tl.constexpr, WIDTH_P: tl.constexpr):
    """What the verify walk of one value head (its V block) reads from the pools and weights: the state tile (fp32;
    ``state``: the sequence's slot in the pool), the head's v channels, their conv history rows and weights, and its
    A_log and dt_bias. (The tile's addresses are made here: kept across the walk they cost registers.)"""
    tile = state + v_head * stride_rs_h + offs_k[:, None] * stride_rs_k + offs_v[None, :] * stride_rs_v
    s = tl.load(tile, mask=tile_mask, other=0.0).to(tl.float32)
    v_channels = 2 * KEY_DIM + v_head * DV + offs_v
    v_state = conv_rows + v_channels * stride_cs_c
    v_w = _conv_weights(conv_weight, v_channels, v_mask, stride_w_c, stride_w_k, WIDTH, WIDTH_P)
    return s, v_channels, v_state, v_w, tl.load(A_log + v_head), tl.load(dt_bias + v_head)


@triton.jit
def _conv_weights(conv_weight, channels, c_mask, stride_w_c, stride_w_k, WIDTH: tl.constexpr,
                  WIDTH_P: tl.constexpr):
    offs_w = tl.arange(0, WIDTH_P)
    return tl.load(conv_weight + channels[None, :] * stride_w_c + offs_w[:, None] * stride_w_k,
                   mask=(offs_w < WIDTH)[:, None] & c_mask[None, :], other=0.0).to(tl.float32)


# The verify launch by batch size (sequences), first match wins: (most sequences, V block or None for whole heads with
# the norm in the kernel, warps, split_norm: with V blocks, the norm by each key head's last program instead of a
# second launch). Timed at k = 2 on Qwen3.5-0.8B's shape (bench/NOTES.md, "GDN verify in V blocks"): at 1-2
# sequences V blocks of 32 with the split norm (4 programs a key head: the state streams over 4x the SMs; the batch-1
# verify graph 24 µs under whole heads, "Runs 149-151"); up to 16 whole heads lead blocks whose norm is a second
# launch; above, blocks of 64 at 4 warps (two programs an SM) take a verify 14-17% under whole heads at 64-128
# sequences.
VERIFY_LAUNCHES = ((2, 32, 4, True), (16, None, 8, False), (math.inf, 64, 4, False))


def verify_config(batch: int) -> tuple[int | None, int, bool]:
    """(block_v, num_warps, split_norm) of the verify launch for ``batch`` sequences (``VERIFY_LAUNCHES``)."""
    return next(launch[1:] for launch in VERIFY_LAUNCHES if batch <= launch[0])


@triton.jit
def _gated_deltanet_verify_kernel(
    projected,
    conv_weight,
    conv_state,
    A_log,
    dt_bias,
    norm_weight,
    recurrent_state,
    state_slots,
    history,  # [R, Pmax, D] fp32, last dim contiguous
    out,  # contiguous [N * P, Hv * V]
    counters,  # SPLIT_NORM: int32 [>= N * Hk], zero, left zero (as the decode kernel's SPLIT_V)
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
    stride_h_seq,
    stride_h_pos,
    POSITIONS: tl.constexpr,
    NUM_K_HEADS: tl.constexpr,
    NUM_V_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    WIDTH: tl.constexpr,
    WIDTH_P: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,  # a power of two; V_BLOCKS of them cover DV
    V_BLOCKS: tl.constexpr,
    SPLIT_NORM: tl.constexpr,  # V_BLOCKS > 1: the key head's last program to finish norms every parked output
    BLOCK_HEAD: tl.constexpr,  # next_power_of_2(DV): that norm's vector
    ROUND_WEIGHT_PRODUCT: tl.constexpr,
    USE_PDL: tl.constexpr,  # ops/triton/pdl.py: the first value head's state tile loads while in_proj still runs
):
    """Grid ``(N, Hk, V_BLOCKS)``: program (n, h, c) walks the value heads of key head h (as the decode kernel does)
    and, for each, the P positions in turn with columns ``c*BLOCK_V .. +BLOCK_V`` of the ``[K, V]`` state tile in
    registers, loaded once from the pool and never stored. Every column of the delta rule is independent of the
    others (``u`` and ``o`` are column-wise), so a head's columns can be split over programs; only the gated norm
    needs the whole head: with one block (``V_BLOCKS == 1``) it runs here, else the program parks the rounded
    delta-rule output where the normed one goes and either the key head's last program to finish norms every
    position and value head of it (``SPLIT_NORM``: the decode kernel's ``SPLIT_V`` count, an acquire-release atomic
    a program) or the caller does (the unfused path's norm kernel, a second launch). q and k are recomputed for each
    value head and block (cheap: their rows sit in L1/L2); block 0 of the first value head writes their history,
    block 0 of each head its decay. Nothing in a pool is written, and, but for the parked outputs the last program
    reads behind the count, nothing another program reads. With PDL, what no earlier kernel of the step writes (the
    slot, the weights, and this layer's state tile and gates of the first value head: the pools are written by the
    commit, after every verify) is loaded before ``gdc_wait``, the projected rows and the conv windows after it, as
    in the decode kernel."""
    KEY_DIM = NUM_K_HEADS * DK
    VALUE_DIM = NUM_V_HEADS * DV
    Z_START = 2 * KEY_DIM + VALUE_DIM
    B_START = Z_START + VALUE_DIM
    A_START = B_START + NUM_V_HEADS
    KEYS_AT = 2 * KEY_DIM + VALUE_DIM  # the history entry: [x (C) | keys | updates | decays]
    UPDATES_AT = KEYS_AT + KEY_DIM
    DECAYS_AT = UPDATES_AT + VALUE_DIM

    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
    seq = tl.program_id(0).to(tl.int64)
    k_head = tl.program_id(1)
    v_block = tl.program_id(2)
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = v_block * BLOCK_V + tl.arange(0, BLOCK_V)
    k_mask = offs_k < DK
    v_mask = offs_v < DV
    tile_mask = k_mask[:, None] & v_mask[None, :]
    dtype = out.dtype.element_ty
    conv_dtype = conv_state.dtype.element_ty

    if V_BLOCKS == 1:
        norm_w = tl.load(norm_weight + offs_v, mask=v_mask, other=0.0).to(tl.float32)
    slot = tl.load(state_slots + seq).to(tl.int64)
    conv_rows = conv_state + slot * stride_cs_slot
    q_channels = k_head * DK + offs_k
    k_channels = KEY_DIM + k_head * DK + offs_k
    q_state = conv_rows + q_channels * stride_cs_c
    k_state = conv_rows + k_channels * stride_cs_c
    q_w = _conv_weights(conv_weight, q_channels, k_mask, stride_w_c, stride_w_k, WIDTH, WIDTH_P)
    k_w = _conv_weights(conv_weight, k_channels, k_mask, stride_w_c, stride_w_k, WIDTH, WIDTH_P)
    first_row = projected + seq * POSITIONS * stride_p_b
    entries = history + seq * stride_h_seq
    state = recurrent_state + slot * stride_rs_slot
    first = _verify_head_loads(state, tile_mask, conv_rows, conv_weight, A_log, dt_bias, k_head * GROUP, offs_k, offs_v,
                               v_mask, stride_rs_h, stride_rs_k, stride_rs_v, stride_cs_c, stride_w_c, stride_w_k,
                               KEY_DIM, DV, WIDTH, WIDTH_P)
    if USE_PDL:
        tl.extra.cuda.gdc_wait()  # in_proj's output (projected) is read, and the history and out written, after this

    for j in tl.static_range(GROUP):
        v_head = k_head * GROUP + j
        if j == 0:
            s, v_channels, v_state, v_w, A_log_val, dt_bias_val = first
        else:
            s, v_channels, v_state, v_w, A_log_val, dt_bias_val = _verify_head_loads(
                state, tile_mask, conv_rows, conv_weight, A_log, dt_bias, v_head, offs_k, offs_v, v_mask, stride_rs_h,
                stride_rs_k, stride_rs_v, stride_cs_c, stride_w_c, stride_w_k, KEY_DIM, DV, WIDTH, WIDTH_P)
        # Unrolled, each position's loads issued before the previous position's math and stores: a load after a
        # store stays after it (the compiler does not know they cannot alias), so in program order the walk would
        # wait a round trip to memory a position.
        loads = _position_loads(first_row, q_state, k_state, v_state, q_channels, k_channels, v_channels, k_mask,
                                v_mask, v_head, offs_v, 0, stride_p_b, stride_p_c, stride_cs_k, A_START, B_START,
                                Z_START, DV, WIDTH, WIDTH_P, V_BLOCKS == 1)
        for i in tl.static_range(POSITIONS):
            q_rows, q_hist, k_rows, k_hist, v_rows, v_hist, x_q, x_k, x_v, a_val, b_val, z = loads
            if i + 1 < POSITIONS:
                loads = _position_loads(first_row, q_state, k_state, v_state, q_channels, k_channels, v_channels,
                                        k_mask, v_mask, v_head, offs_v, i + 1, stride_p_b, stride_p_c, stride_cs_k,
                                        A_START, B_START, Z_START, DV, WIDTH, WIDTH_P, V_BLOCKS == 1)
            entry = entries + i * stride_h_pos
            q = _conv_window(q_rows, q_hist, q_w, conv_dtype, dtype)
            k = _conv_window(k_rows, k_hist, k_w, conv_dtype, dtype)
            v = _conv_window(v_rows, v_hist, v_w, conv_dtype, dtype)
            q = q * tl.rsqrt(tl.sum(q * q, 0) + L2NORM_EPS) * scale  # l2norm in fp32, q scaled by K**-0.5
            k = k * tl.rsqrt(tl.sum(k * k, 0) + L2NORM_EPS)

            decay, beta = decay_and_beta(a_val, b_val, A_log_val, dt_bias_val)
            s = s * decay  # S *= exp(g)
            u = (v - tl.sum(s * k[:, None], 0)) * beta  # u = (v - S^T k) beta
            s = s + k[:, None] * u[None, :]  # S += k (x) u
            o = tl.sum(s * q[:, None], 0)  # o = S^T q, after the update
            s = s.to(recurrent_state.dtype.element_ty).to(tl.float32)  # what the pool would hold after a decode step

            # the history: the conv inputs (in the conv state's dtype, held in fp32), keys, update and decay
            tl.store(entry + v_channels, x_v.to(conv_dtype).to(tl.float32), mask=v_mask)
            tl.store(entry + UPDATES_AT + v_head * DV + offs_v, u, mask=v_mask)
            if v_block == 0:
                tl.store(entry + DECAYS_AT + v_head, decay)
                if j == 0:
                    tl.store(entry + q_channels, x_q.to(conv_dtype).to(tl.float32), mask=k_mask)
                    tl.store(entry + k_channels, x_k.to(conv_dtype).to(tl.float32), mask=k_mask)
                    tl.store(entry + KEYS_AT + k_head * DK + offs_k, k, mask=k_mask)

            o = o.to(dtype).to(tl.float32)  # the delta-rule op's output, in v's dtype
            if V_BLOCKS == 1:  # the gated RMSNorm over V, rounded where the unfused path rounds (as in decode)
                o = _gated_norm(o, tl.rsqrt(tl.sum(o * o, 0) / DV + eps), z, norm_w, dtype, ROUND_WEIGHT_PRODUCT)
            tl.store(out + (seq * POSITIONS + i) * VALUE_DIM + v_head * DV + offs_v, o.to(dtype), mask=v_mask)
    if SPLIT_NORM:  # as the decode kernel's SPLIT_V: the barrier, the count's release, the last one norms
        tl.debug_barrier()  # every thread's parked outputs of this program before the count
        counter = counters + seq * NUM_K_HEADS + k_head
        if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == V_BLOCKS - 1:
            tl.store(counter, 0)
            for i in tl.static_range(POSITIONS):
                for j in tl.static_range(GROUP):
                    _head_norm(out + (seq * POSITIONS + i) * VALUE_DIM, first_row + i * stride_p_b, norm_weight,
                               k_head * GROUP + j, 0.0, stride_p_c, Z_START, DV, BLOCK_HEAD, eps, dtype,
                               ROUND_WEIGHT_PRODUCT, True)


def gated_deltanet_verify(
    projected: torch.Tensor,  # [N*P, Pw]: [q | k | v | z | b | a], last dim contiguous
    conv_weight: torch.Tensor,  # [C, W]
    conv_state: torch.Tensor,  # [S, C, W-1]  (read only)
    A_log: torch.Tensor,  # [Hv]
    dt_bias: torch.Tensor,  # [Hv]
    norm_weight: torch.Tensor,  # [V]
    recurrent_state: torch.Tensor,  # [S, Hv, K, V]  (read only)
    state_slots: torch.Tensor,  # [N] int32
    history: torch.Tensor,  # [R, Pmax, D] fp32  (written at [:N, :P])
    num_k_heads: int,
    head_k_dim: int,
    num_v_heads: int,
    head_v_dim: int,
    eps: float,
    num_warps: int | None = None,
    block_v: int | None = None,
    split_norm: bool | None = None,
) -> torch.Tensor:
    """One launch, grid (sequences, key heads, V blocks), with the launch :func:`verify_config` picks for the batch
    unless ``block_v`` / ``num_warps`` / ``split_norm`` say otherwise; below V (``block_v`` a power of two) the gated
    norm runs in the last program of each key head to finish (``split_norm``) or as a second launch (the unfused
    path's norm kernel)."""
    positions = check_gated_deltanet_verify_args(projected, conv_weight, state_slots, history, num_k_heads,
                                                 head_k_dim, num_v_heads, head_v_dim)
    if history.stride(2) != 1:
        raise ValueError("gated_deltanet_verify: the history's last dimension must be contiguous")
    width = conv_weight.shape[1]
    rows, value_dim = projected.shape[0], num_v_heads * head_v_dim
    num_seqs = state_slots.shape[0]
    default_block_v, default_warps, default_split = verify_config(num_seqs)
    block_v = triton.next_power_of_2(min(block_v or default_block_v or head_v_dim, head_v_dim))
    v_blocks = triton.cdiv(head_v_dim, block_v)
    split_norm = (default_split if split_norm is None else split_norm) and v_blocks > 1
    out = torch.empty((rows, value_dim), dtype=projected.dtype, device=projected.device)
    A_log, dt_bias, norm_weight, state_slots = unit_stride(A_log, dt_bias, norm_weight, state_slots)
    _gated_deltanet_verify_kernel[(num_seqs, num_k_heads, v_blocks)](
        projected,
        conv_weight,
        conv_state,
        A_log,
        dt_bias,
        norm_weight,
        recurrent_state,
        state_slots,
        history,
        out,
        split_counters(projected.device, num_seqs * num_k_heads) if split_norm else state_slots,  # (else unused)
        head_k_dim**-0.5,
        eps,
        *projected.stride(),
        *conv_weight.stride(),
        *conv_state.stride(),
        *recurrent_state.stride(),
        history.stride(0),
        history.stride(1),
        POSITIONS=positions,
        NUM_K_HEADS=num_k_heads,
        NUM_V_HEADS=num_v_heads,
        GROUP=num_v_heads // num_k_heads,
        DK=head_k_dim,
        DV=head_v_dim,
        WIDTH=width,
        WIDTH_P=triton.next_power_of_2(width),
        BLOCK_K=triton.next_power_of_2(head_k_dim),
        BLOCK_V=block_v,
        V_BLOCKS=v_blocks,
        SPLIT_NORM=split_norm,
        BLOCK_HEAD=triton.next_power_of_2(head_v_dim),
        ROUND_WEIGHT_PRODUCT=torch.promote_types(norm_weight.dtype, projected.dtype) == projected.dtype,
        num_warps=num_warps or default_warps,
        **pdl_flags(projected),
    )
    if v_blocks == 1 or split_norm:
        return out
    z_start = 2 * num_k_heads * head_k_dim + value_dim  # [q | k | v | z | b | a]
    z = projected[:, z_start:z_start + value_dim].view(rows, num_v_heads, head_v_dim)
    return norm_kernels.rms_norm(out.view(rows, num_v_heads, head_v_dim), norm_weight, z, eps, False).view(rows, -1)


@triton.jit
def _gated_deltanet_commit_kernel(
    conv_states,  # [L] int64: each layer's conv state's address
    recurrent_states,  # [L] int64
    state_slots,
    histories,  # [L] int64
    num_accepted,
    stride_cs_slot,
    stride_cs_c,
    stride_cs_k,
    stride_rs_slot,
    stride_rs_h,
    stride_rs_k,
    stride_rs_v,
    stride_h_seq,
    stride_h_pos,
    POSITIONS: tl.constexpr,  # the history's positions (the most a verify step has)
    NUM_K_HEADS: tl.constexpr,
    NUM_V_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    DK: tl.constexpr,
    DV: tl.constexpr,
    WIDTH: tl.constexpr,
    HIST_P: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
    V_BLOCKS: tl.constexpr,
    BLOCK_C: tl.constexpr,  # conv channels a program commits: cdiv(C, Hv * V_BLOCKS) rounded up to a power of two
    CONV_DTYPE: tl.constexpr,
    STATE_DTYPE: tl.constexpr,
):
    """Grid ``(N, Hv * V_BLOCKS, L)``: program (n, j * V_BLOCKS + c, l) replays, in layer l, the accepted updates on
    columns ``c*BLOCK_V .. +BLOCK_V`` of value head j's state tile (the update is column-wise: ``S[:, v] = S[:, v] *
    decay + k * u[v]``), and shifts a slice of BLOCK_C conv channels. Each program reads and writes only its own part
    of the slot (the conv slice in place, after a barrier). The layers' tensors come as address tables: one launch
    for every layer (they share shapes, strides and dtypes)."""
    KEY_DIM = NUM_K_HEADS * DK
    CHANNELS = 2 * KEY_DIM + NUM_V_HEADS * DV
    KEYS_AT = CHANNELS
    UPDATES_AT = KEYS_AT + KEY_DIM
    DECAYS_AT = UPDATES_AT + NUM_V_HEADS * DV

    seq = tl.program_id(0).to(tl.int64)
    v_head = tl.program_id(1) // V_BLOCKS
    v_block = tl.program_id(1) % V_BLOCKS
    layer = tl.program_id(2)
    conv_state = tl.load(conv_states + layer).to(tl.pointer_type(CONV_DTYPE))
    recurrent_state = tl.load(recurrent_states + layer).to(tl.pointer_type(STATE_DTYPE))
    history = tl.load(histories + layer).to(tl.pointer_type(tl.float32))
    slot = tl.load(state_slots + seq).to(tl.int64)
    accepted = tl.load(num_accepted + seq).to(tl.int32)
    entries = history + seq * stride_h_seq

    # Recurrent state: positions 0 .. accepted, each S = S * decay + k (x) u, rounded as the pool stores it.
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = v_block * BLOCK_V + tl.arange(0, BLOCK_V)
    k_mask = offs_k < DK
    v_mask = offs_v < DV
    tile = (recurrent_state + slot * stride_rs_slot + v_head * stride_rs_h + offs_k[:, None] * stride_rs_k
            + offs_v[None, :] * stride_rs_v)
    tile_mask = k_mask[:, None] & v_mask[None, :]
    s = tl.load(tile, mask=tile_mask, other=0.0).to(tl.float32)
    k_head = v_head // GROUP
    # Unrolled over the history's positions, so that every load can be issued up front (one round trip to memory,
    # not one per position); a position past the accepted ones takes decay 1, k 0 and u 0 (whatever its entry holds:
    # it may never have been written), which leave S exactly as it is.
    for i in tl.static_range(POSITIONS):
        entry = entries + i * stride_h_pos
        active = accepted >= i  # the loads stay in bounds either way: the history holds POSITIONS entries
        k = tl.where(active, tl.load(entry + KEYS_AT + k_head * DK + offs_k, mask=k_mask, other=0.0), 0.0)
        u = tl.where(active, tl.load(entry + UPDATES_AT + v_head * DV + offs_v, mask=v_mask, other=0.0), 0.0)
        decay = tl.where(active, tl.load(entry + DECAYS_AT + v_head), 1.0)
        s = s * decay
        s = s + k[:, None] * u[None, :]
        s = s.to(STATE_DTYPE).to(tl.float32)
    tl.store(tile, s.to(STATE_DTYPE), mask=tile_mask)

    # Conv history: column m of the new history is input accepted + 1 + m of [old history (W-1) | x_0 .. x_P-1].
    channels = (v_head * V_BLOCKS + v_block) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = channels < CHANNELS
    offs_h = tl.arange(0, HIST_P)
    h_mask = offs_h < WIDTH - 1
    src = accepted + 1 + offs_h
    rows = conv_state + slot * stride_cs_slot + channels[:, None] * stride_cs_c
    from_state = tl.load(rows + src[None, :] * stride_cs_k,
                         mask=c_mask[:, None] & (h_mask & (src < WIDTH - 1))[None, :], other=0.0)
    from_rows = tl.load(entries + (src - (WIDTH - 1)).to(tl.int64)[None, :] * stride_h_pos + channels[:, None],
                        mask=c_mask[:, None] & (h_mask & (src >= WIDTH - 1))[None, :], other=0.0)
    new = tl.where((src < WIDTH - 1)[None, :], from_state, from_rows.to(CONV_DTYPE))
    tl.debug_barrier()  # every read of this slice's old history happens before any write below
    tl.store(rows + offs_h[None, :] * stride_cs_k, new, mask=c_mask[:, None] & h_mask[None, :])


_TRITON_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
# Address tables by (device, addresses): made once for each list of tensors. The state pools and histories are
# allocated once, so a CUDA graph captured after a warm-up call finds its table made (a capture cannot copy from the
# host); a table holds addresses only, so an entry stays right for whatever tensor later lives at them.
_ADDRESS_TABLES: dict[tuple, torch.Tensor] = {}


def _address_table(tensors: list[torch.Tensor]) -> torch.Tensor:
    key = (tensors[0].device, *(t.data_ptr() for t in tensors))
    table = _ADDRESS_TABLES.get(key)
    if table is None:
        table = torch.tensor(key[1:], dtype=torch.int64).to(tensors[0].device)
        _ADDRESS_TABLES[key] = table
    return table


def gated_deltanet_commit(
    conv_states: list[torch.Tensor],  # per layer [S, C, W-1]  (written at state_slots)
    recurrent_states: list[torch.Tensor],  # per layer [S, Hv, K, V]  (written at state_slots)
    state_slots: torch.Tensor,  # [N] int32
    histories: list[torch.Tensor],  # per layer [R, Pmax, D] fp32
    num_accepted: torch.Tensor,  # [N] int64
    num_k_heads: int,
    head_k_dim: int,
    num_v_heads: int,
    head_v_dim: int,
    block_v: int = 32,
) -> None:
    """One launch for every layer: ``V / block_v`` programs a value head and layer (4 at V = 128: 64 programs a
    sequence and layer at Qwen3.5-0.8B's shape, 1,152 over its 18 linear layers), each moving a [K, block_v] fp32
    slice (16 KiB) in and out, and ~100 conv channels."""
    n, layers = state_slots.shape[0], len(conv_states)
    if not layers == len(recurrent_states) == len(histories):
        raise ValueError("gated_deltanet_commit: one conv state, recurrent state and history per layer")
    for group in (conv_states, recurrent_states, histories):
        if any((t.shape, t.stride(), t.dtype, t.device) != (group[0].shape, group[0].stride(), group[0].dtype,
                                                            group[0].device) for t in group):
            raise ValueError("gated_deltanet_commit: every layer's tensors must share shape, strides, dtype, device")
    if n == 0 or layers == 0:
        return
    conv_state, recurrent_state, history = conv_states[0], recurrent_states[0], histories[0]
    if history.stride(2) != 1 or history.dtype != torch.float32:
        raise ValueError("gated_deltanet_commit: histories must be fp32 with a contiguous last dimension")
    width = conv_state.shape[2] + 1
    channels = 2 * num_k_heads * head_k_dim + num_v_heads * head_v_dim
    block_v = min(block_v, triton.next_power_of_2(head_v_dim))
    v_blocks = triton.cdiv(head_v_dim, block_v)
    state_slots, num_accepted = unit_stride(state_slots, num_accepted)
    _gated_deltanet_commit_kernel[(n, num_v_heads * v_blocks, layers)](
        _address_table(conv_states),
        _address_table(recurrent_states),
        state_slots,
        _address_table(histories),
        num_accepted,
        *conv_state.stride(),
        *recurrent_state.stride(),
        history.stride(0),
        history.stride(1),
        POSITIONS=history.shape[1],
        NUM_K_HEADS=num_k_heads,
        NUM_V_HEADS=num_v_heads,
        GROUP=num_v_heads // num_k_heads,
        DK=head_k_dim,
        DV=head_v_dim,
        WIDTH=width,
        HIST_P=triton.next_power_of_2(width - 1),
        BLOCK_K=triton.next_power_of_2(head_k_dim),
        BLOCK_V=block_v,
        V_BLOCKS=v_blocks,
        BLOCK_C=triton.next_power_of_2(triton.cdiv(channels, num_v_heads * v_blocks)),
        CONV_DTYPE=_TRITON_DTYPES[conv_state.dtype],
        STATE_DTYPE=_TRITON_DTYPES[recurrent_state.dtype],
        num_warps=4,
    )
