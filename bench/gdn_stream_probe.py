"""How close a delta-rule decode can stream the recurrent state to the copy bandwidth, persistent and pipelined.

    python3 bench/gdn_stream_probe.py --batches 64,128,256 --out /tmp/probe

The decode's traffic at large batch is the recurrent state, read and written once a token (1 MiB a sequence and layer
for Qwen3.5-0.8B's 16 heads of 128 x 128, fp32). ``ce::gated_delta_rule_decode``'s kernel (one ``[K, BLOCK_V]`` tile a
program, grid (batch, value head, V tiles)) streams it at ~80% of the copy bandwidth on an H200; each program loads
its tile, waits, computes and stores, so what is in flight an SM is the resident programs' tiles in their load phase.
This probe times the same math in a persistent grid whose programs loop over the tiles with Triton's software
pipeliner (``tl.range(..., num_stages=S)``: the next tiles' loads issued while one is computed), against that kernel,
one call a CUDA graph, at several grid sizes, stages, tile widths and warps. A probe, not a library path: it decides
whether a pipelined fused GDN decode is worth building.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from ops.triton.conv1d_kernels import conv_step, store_history
from ops.triton.delta_rule_kernels import L2NORM_EPS, decay_and_beta, gated_delta_rule_decode
from ops.triton.gated_deltanet_kernels import _gated_norm, gated_deltanet_decode


@triton.jit
def _stream_kernel(q, k, v, a, b, A_log, dt_bias, state, state_slots, out, scale, num_items,
                   stride_s_slot, stride_s_h, stride_s_k,
                   HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BLOCK_V: tl.constexpr,
                   STAGES: tl.constexpr):
    """Item i = (sequence, value head, V tile) in that order; program p takes items p, p + P, ... (P programs)."""
    V_TILES: tl.constexpr = DV // BLOCK_V
    GROUP: tl.constexpr = HV // HK
    offs_k = tl.arange(0, DK)
    offs_t = tl.arange(0, BLOCK_V)
    for item in tl.range(tl.program_id(0), num_items, tl.num_programs(0), num_stages=STAGES):
        seq = item // (HV * V_TILES)
        v_head = (item // V_TILES) % HV
        offs_v = (item % V_TILES) * BLOCK_V + offs_t
        k_head = v_head // GROUP
        slot = tl.load(state_slots + seq).to(tl.int64)
        tile = state + slot * stride_s_slot + v_head * stride_s_h + offs_k[:, None] * stride_s_k + offs_v[None, :]
        s = tl.load(tile)
        q_vec = tl.load(q + (seq * HK + k_head) * DK + offs_k).to(tl.float32)
        k_vec = tl.load(k + (seq * HK + k_head) * DK + offs_k).to(tl.float32)
        v_vec = tl.load(v + (seq * HV + v_head) * DV + offs_v).to(tl.float32)
        decay, beta = decay_and_beta(tl.load(a + seq * HV + v_head), tl.load(b + seq * HV + v_head),
                                     tl.load(A_log + v_head), tl.load(dt_bias + v_head))
        q_vec = q_vec * tl.rsqrt(tl.sum(q_vec * q_vec, 0) + L2NORM_EPS) * scale
        k_vec = k_vec * tl.rsqrt(tl.sum(k_vec * k_vec, 0) + L2NORM_EPS)
        s = s.to(tl.float32) * decay
        u = (v_vec - tl.sum(s * k_vec[:, None], 0)) * beta
        s = s + k_vec[:, None] * u[None, :]
        o = tl.sum(s * q_vec[:, None], 0)
        tl.store(tile, s.to(state.dtype.element_ty))
        tl.store(out + (seq * HV + v_head) * DV + offs_v, o.to(out.dtype.element_ty))


@triton.jit
def _conv_load_once(weight, state_rows, offs_c, c_mask, stride_w_c, stride_w_k, stride_s_k, WIDTH: tl.constexpr,
                    HIST_P: tl.constexpr):
    """conv_load's values with the history read once: the shifted copy (column k <- k + 1) is taken from the loaded
    history in registers, so each thread's write of the new history depends on every read it replaces (a shuffle or
    a shared-memory exchange), with no barrier in the loop (which would keep Triton from pipelining it)."""
    offs_k = tl.arange(0, HIST_P)
    mask = c_mask[:, None] & (offs_k < WIDTH - 1)[None, :]
    history = tl.load(state_rows[:, None] + offs_k[None, :] * stride_s_k, mask=mask, other=0.0)
    select = offs_k[None, :] == offs_k[:, None] + 1  # [k, j]: column j moves to k
    shifted = tl.sum(tl.where(select[None, :, :], history[:, None, :].to(tl.float32), 0.0), 2).to(history.dtype)
    w_hist = tl.load(weight + offs_c[:, None] * stride_w_c + offs_k[None, :] * stride_w_k, mask=mask, other=0.0)
    w_new = tl.load(weight + offs_c * stride_w_c + (WIDTH - 1) * stride_w_k, mask=c_mask, other=0.0)
    return history, shifted, w_hist, w_new


@triton.jit
def _fused_stream_kernel(projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, recurrent_state,
                         state_slots, out, scale, eps, num_items, stride_p_b, stride_w_c, stride_w_k, stride_cs_slot,
                         stride_cs_c, stride_cs_k, stride_rs_slot, stride_rs_h, stride_rs_k,
                         NUM_K_HEADS: tl.constexpr, NUM_V_HEADS: tl.constexpr, GROUP: tl.constexpr, DK: tl.constexpr,
                         DV: tl.constexpr, WIDTH: tl.constexpr, HIST_P: tl.constexpr,
                         ROUND_WEIGHT_PRODUCT: tl.constexpr, STAGES: tl.constexpr):
    """``ce::gated_deltanet_decode``'s math (whole heads) with item i = (sequence, key head) in a persistent grid
    whose loop Triton pipelines. Unit strides for the channels and V (the model's buffers)."""
    KEY_DIM: tl.constexpr = NUM_K_HEADS * DK
    VALUE_DIM: tl.constexpr = NUM_V_HEADS * DV
    Z_START: tl.constexpr = 2 * KEY_DIM + VALUE_DIM
    B_START: tl.constexpr = Z_START + VALUE_DIM
    A_START: tl.constexpr = B_START + NUM_V_HEADS
    offs_k = tl.arange(0, DK)
    offs_v = tl.arange(0, DV)
    k_all = offs_k < DK
    v_all = offs_v < DV
    norm_w = tl.load(norm_weight + offs_v).to(tl.float32)
    dtype = out.dtype.element_ty
    for item in tl.range(tl.program_id(0), num_items, tl.num_programs(0), num_stages=STAGES):
        seq = item // NUM_K_HEADS
        k_head = item % NUM_K_HEADS
        slot = tl.load(state_slots + seq).to(tl.int64)
        conv_rows = conv_state + slot * stride_cs_slot
        row = projected + seq * stride_p_b
        q_channels = k_head * DK + offs_k
        k_channels = KEY_DIM + k_head * DK + offs_k
        q_rows = conv_rows + q_channels * stride_cs_c
        k_rows = conv_rows + k_channels * stride_cs_c
        q_hist, q_shifted, q_w_hist, q_w_new = _conv_load_once(conv_weight, q_rows, q_channels, k_all, stride_w_c,
                                                         stride_w_k, stride_cs_k, WIDTH, HIST_P)
        k_hist, k_shifted, k_w_hist, k_w_new = _conv_load_once(conv_weight, k_rows, k_channels, k_all, stride_w_c,
                                                         stride_w_k, stride_cs_k, WIDTH, HIST_P)
        x_q = tl.load(row + q_channels)
        x_k = tl.load(row + k_channels)
        q, q_history = conv_step(x_q, q_hist, q_shifted, q_w_hist, q_w_new, WIDTH, HIST_P)
        k, k_history = conv_step(x_k, k_hist, k_shifted, k_w_hist, k_w_new, WIDTH, HIST_P)
        q = q * tl.rsqrt(tl.sum(q * q, 0) + L2NORM_EPS) * scale
        k = k * tl.rsqrt(tl.sum(k * k, 0) + L2NORM_EPS)
        for j in tl.static_range(GROUP):
            v_head = k_head * GROUP + j
            tile = recurrent_state + slot * stride_rs_slot + v_head * stride_rs_h + offs_k[:, None] * stride_rs_k \
                + offs_v[None, :]
            s = tl.load(tile).to(tl.float32)
            v_channels = 2 * KEY_DIM + v_head * DV + offs_v
            v_rows = conv_rows + v_channels * stride_cs_c
            v_hist, v_shifted, v_w_hist, v_w_new = _conv_load_once(conv_weight, v_rows, v_channels, v_all, stride_w_c,
                                                             stride_w_k, stride_cs_k, WIDTH, HIST_P)
            x_v = tl.load(row + v_channels)
            z = tl.load(row + Z_START + v_head * DV + offs_v)
            decay, beta = decay_and_beta(tl.load(row + A_START + v_head), tl.load(row + B_START + v_head),
                                         tl.load(A_log + v_head), tl.load(dt_bias + v_head))
            v, v_history = conv_step(x_v, v_hist, v_shifted, v_w_hist, v_w_new, WIDTH, HIST_P)
            s = s * decay
            u = (v - tl.sum(s * k[:, None], 0)) * beta
            s = s + k[:, None] * u[None, :]
            o = tl.sum(s * q[:, None], 0)
            tl.store(tile, s.to(recurrent_state.dtype.element_ty))
            store_history(v_rows, v_all, v_history, stride_cs_k, WIDTH, HIST_P)
            o = o.to(dtype).to(tl.float32)
            y = _gated_norm(o, tl.rsqrt(tl.sum(o * o, 0) / DV + eps), z, norm_w, dtype, ROUND_WEIGHT_PRODUCT)
            tl.store(out + seq * VALUE_DIM + v_head * DV + offs_v, y)
        store_history(q_rows, k_all, q_history, stride_cs_k, WIDTH, HIST_P)
        store_history(k_rows, k_all, k_history, stride_cs_k, WIDTH, HIST_P)


def fused_stream_decode(projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, recurrent_state, slots, hk,
                        dk, hv, dv, eps, programs, stages, warps):
    batch = projected.shape[0]
    out = torch.empty(batch, hv * dv, dtype=projected.dtype, device=projected.device)
    items = batch * hk
    width = conv_weight.shape[1]
    _fused_stream_kernel[(min(programs, items),)](
        projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, recurrent_state, slots, out, dk ** -0.5,
        eps, items, projected.stride(0), *conv_weight.stride(), *conv_state.stride(), *recurrent_state.stride()[:3],
        NUM_K_HEADS=hk, NUM_V_HEADS=hv, GROUP=hv // hk, DK=dk, DV=dv, WIDTH=width,
        HIST_P=triton.next_power_of_2(width - 1),
        ROUND_WEIGHT_PRODUCT=torch.promote_types(norm_weight.dtype, projected.dtype) == projected.dtype,
        STAGES=stages, num_warps=warps)
    return out


def stream_decode(q, k, v, a, b, A_log, dt_bias, state, slots, programs, stages, block_v, warps):
    batch, hv, dv = v.shape
    hk, dk = q.shape[1], q.shape[2]
    out = torch.empty_like(v)
    items = batch * hv * (dv // block_v)
    _stream_kernel[(min(programs, items),)](
        q, k, v, a, b, A_log, dt_bias, state, slots, out, dk ** -0.5, items, state.stride(0), state.stride(1),
        state.stride(2), HV=hv, HK=hk, DK=dk, DV=dv, BLOCK_V=block_v, STAGES=stages, num_warps=warps)
    return out


def _graph_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return triton.testing.do_bench(g.replay, warmup=10, rep=80, return_mode="median") * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", default="64,128,256")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    torch.manual_seed(0)
    dev = "cuda"
    hk = hv = 16
    dk = dv = 128
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    copy = torch.empty(1 << 28, dtype=torch.float32, device=dev)
    dst = torch.empty_like(copy)
    copy_us = _graph_us(lambda: dst.copy_(copy))
    copy_gbps = 2 * copy.numel() * 4 / copy_us / 1e3
    print(f"copy bandwidth {copy_gbps:.0f} GB/s, {sms} SMs")
    rows = []
    for batch in [int(x) for x in args.batches.split(",")]:
        slots_n = batch + 1
        state = torch.randn(slots_n, hv, dk, dv, device=dev) * 0.01
        slots = torch.randperm(slots_n - 1, device=dev)[:batch].add(1).to(torch.int32)
        q = torch.randn(batch, hk, dk, device=dev, dtype=torch.bfloat16)
        k = torch.randn(batch, hk, dk, device=dev, dtype=torch.bfloat16)
        v = torch.randn(batch, hv, dv, device=dev, dtype=torch.bfloat16)
        a = torch.randn(batch, hv, device=dev, dtype=torch.bfloat16)
        b = torch.randn(batch, hv, device=dev, dtype=torch.bfloat16)
        A_log = torch.randn(hv, device=dev)
        dt_bias = torch.randn(hv, device=dev)
        nbytes = 2 * batch * hv * dk * dv * 4

        def add(name, us):
            frac = nbytes / (us * 1e-6) / 1e9 / copy_gbps
            rows.append(dict(batch=batch, variant=name, us=round(us, 2), frac_copy=round(frac, 3)))
            print(f"B={batch:4d} {name:40s} {us:8.2f} µs  {frac:6.1%} of copy")

        ref_state = state.clone()
        want = gated_delta_rule_decode(q, k, v, a, b, A_log, dt_bias, ref_state, slots)
        got_state = state.clone()
        got = stream_decode(q, k, v, a, b, A_log, dt_bias, got_state, slots, 4 * sms, 2, 32, 4)
        torch.cuda.synchronize()
        print(f"B={batch} check: out max diff {(got.float() - want.float()).abs().max().item():.3g}, "
              f"state max diff {(got_state - ref_state).abs().max().item():.3g}")
        add("gated_delta_rule_decode v64 w4", _graph_us(
            lambda: gated_delta_rule_decode(q, k, v, a, b, A_log, dt_bias, state, slots)))
        add("gated_delta_rule_decode v32 w4", _graph_us(
            lambda: gated_delta_rule_decode(q, k, v, a, b, A_log, dt_bias, state, slots, block_v=32)))
        for block_v, warps in ((32, 4), (64, 4), (32, 2), (64, 8)):
            for per_sm in (1, 2, 4, 8):
                for stages in (1, 2, 3, 4):
                    try:
                        us = _graph_us(lambda: stream_decode(q, k, v, a, b, A_log, dt_bias, state, slots,
                                                             per_sm * sms, stages, block_v, warps))
                    except Exception as exc:  # noqa: BLE001 - out of shared memory for some configs: report, go on
                        print(f"B={batch} v{block_v} w{warps} x{per_sm} s{stages}: {type(exc).__name__}")
                        continue
                    add(f"stream v{block_v} w{warps} {per_sm}/SM stages {stages}", us)
        # The whole layer between the projections: the library's fused kernel (its rule's launch, and V tiles of 32
        # over programs) against the same math in a persistent pipelined grid (whole heads in shared memory)
        width, channels = 4, 2 * hk * dk + hv * dv
        projected = torch.randn(batch, channels + hv * dv + 2 * hv, device=dev, dtype=torch.bfloat16)
        conv_weight = torch.randn(channels, width, device=dev, dtype=torch.bfloat16) * 0.3
        conv_state = torch.randn(slots_n, channels, width - 1, device=dev, dtype=torch.bfloat16)
        norm_weight = torch.randn(dv, device=dev, dtype=torch.bfloat16)
        layer = (projected, conv_weight, conv_state, A_log, dt_bias, norm_weight)
        ref_state = state.clone()
        want = gated_deltanet_decode(*layer[:6], ref_state, slots, hk, dk, hv, dv, 1e-6)
        got_state = state.clone()
        got = fused_stream_decode(*layer, got_state, slots, hk, dk, hv, dv, 1e-6, sms, 2, 8)
        torch.cuda.synchronize()
        print(f"B={batch} fused check: out max diff {(got.float() - want.float()).abs().max().item():.3g}, "
              f"state max diff {(got_state - ref_state).abs().max().item():.3g}")
        add("fused rule", _graph_us(lambda: gated_deltanet_decode(*layer, state, slots, hk, dk, hv, dv, 1e-6)))
        add("fused v32 split", _graph_us(lambda: gated_deltanet_decode(*layer, state, slots, hk, dk, hv, dv, 1e-6,
                                                                      num_warps=4, block_v=32, prefetch=False,
                                                                      split_v=True)))
        for warps in (8, 16):
            for per_sm in (1, 2):
                for stages in (1, 2, 3):
                    try:
                        us = _graph_us(lambda: fused_stream_decode(*layer, state, slots, hk, dk, hv, dv, 1e-6,
                                                                   per_sm * sms, stages, warps))
                    except Exception as exc:  # noqa: BLE001
                        print(f"B={batch} fused w{warps} x{per_sm} s{stages}: {type(exc).__name__}")
                        continue
                    add(f"fused stream w{warps} {per_sm}/SM stages {stages}", us)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gdn_stream_probe.json").write_text(json.dumps(dict(copy_gbps=copy_gbps, sms=sms, rows=rows),
                                                              indent=1))
    best = {}
    for r in rows:
        if r["batch"] not in best or r["us"] < best[r["batch"]]["us"]:
            best[r["batch"]] = r
    for batch, r in best.items():
        print(f"best at B={batch}: {r['variant']} {r['us']} µs ({r['frac_copy']:.1%})")


if __name__ == "__main__":
    main()
