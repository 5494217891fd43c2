"""Triton kernel for ``ce::linear`` at few rows (decode): ``out[M, N] = x[M, K] @ weight[N, K]^T``, M = 1..16.

(and for ``ce::silu_mul_linear``: the same with ``silu(gate) * up`` computed from x = ``[gate | up]`` as it loads.)

Why: a decode step at batch 1..16 reads every weight once and does M multiply-adds per weight element, so its weight
matmuls should run at memory bandwidth. cuBLAS picks kernels made for large M on these small matrices (bench/NOTES.md,
"Skinny GEMM", has the measurements behind this module's choices).

Design, for bandwidth:
  * each program owns BLOCK_N weight rows (output columns) for BLOCK_M rows of x (x's M rows, padded to BLOCK_M by
    masked loads: no weight traffic) and streams them along K in BLOCK_K chunks. K is the contiguous axis of the
    row-major weight, so the loads coalesce into 16-byte vectors, and each weight element is read once whatever M
    is. Accumulation is fp32.
  * three ways to multiply, chosen by the config's BLOCK_M and DOT:
      - one row (BLOCK_M = 1): a CUDA-core GEMV, elementwise products summed into a [BLOCK_N, BLOCK_K] fp32
        accumulator that is reduced once after the loop (no cross-thread reduction inside it);
      - a few rows (BLOCK_M = 2..8, not DOT): the same GEMV with the BLOCK_M rows of x beside the weights in every
        thread; BLOCK_M multiply-adds per weight element on CUDA cores, and registers that grow with
        BLOCK_M x BLOCK_N;
      - tensor cores (DOT): ``tl.dot`` with the weight tile as the left operand ("swap AB"): its long side BLOCK_N
        is the MMA's M side (Hopper's wgmma takes 64 rows a warpgroup), x's BLOCK_M rows its N side (wgmma takes
        multiples of 8, hence BLOCK_M >= 8 there). The multiply is free; what costs is the operands' trip through
        shared memory.
  * split-K: SPLIT_K programs per column block each take a contiguous 1/SPLIT_K of K and write fp32 partial sums to
    ``partials[SPLIT_K, M, N]``; a second small kernel adds them up and casts. No atomics, no memset: every program
    writes its whole partial tile, zeros for an empty K range included. SPLIT_K == 1 writes the output directly, in
    one launch.
  * latency, not only bandwidth: most of these matrices are 4-17 MB, 1-4 µs of DRAM time, and a launch, its
    ramp-up and its tail cost as much again. Three things hide some of it. Programmatic dependent launch
    (ops/triton/pdl.py): the kernel lets the next one start at once (the split-K sum too); the first programs
    prefetch the whole weight into L2 before waiting (ops/triton/l2_prefetch.py); and every path loads its first
    weight chunk, which no earlier kernel writes, before waiting for the earlier kernels to finish and reading x.
    The GEMVs then issue every chunk's loads one iteration ahead of its use; the tensor-core path leaves its other
    chunks to Triton's pipeliner.
  * prologues that save a launch each: GATED_X, the MLP's down projection reads ``silu(gate) * up`` straight from
    the gate_up output (``[gate | up]`` rows) instead of a separate ``ce::silu_mul`` launch (``ce::silu_mul_linear``);
    NORM_X, a layer's residual add and RMSNorm run in the prologue of the projection after them, every program
    first summing its rows' squares over the whole K (``ce::add_rms_norm_linear``). Both in ops/linear.py. Every
    program recomputes its x chunk's prologue, so its cost grows with BLOCK_M x K per program: one more reason for
    few, large programs at more rows.
  * configs: by rule (``skinny_config``), from the model's matmul chain timed as a decode step runs it
    (bench/gemv_chain.py), not by ``triton.autotune``, which times each call alone (the L2 flushed, nothing before
    it) and so ranks configs wrongly for a chain of PDL launches whose worth depends on what they overlap. A rule
    also needs no tuning at start-up and never synchronises with the host. The autotuner that chose the 2..16-row
    configs before is kept for one A/B only (``legacy_autotune``; its first call of a key tunes and synchronises,
    so it must not run inside a CUDA-graph capture).
"""

from __future__ import annotations

import functools
import inspect

import torch
import triton
import triton.language as tl
import triton.testing

from ops.triton.l2_prefetch import l2_prefetch_flags, prefetch_l2_slab
from ops.triton.pdl import pdl_flags

DOT_ROWS = 16  # the most rows a call takes; the autotuned path pads every 2..16 rows to it
DOT_MIN_BLOCK_M = 8  # the tensor-core path's least BLOCK_M: wgmma takes x's side in multiples of 8
# Widest output for which split configs are tried. Past it every config has well over 132 programs without a split
# (lm_head: N = 248320), and the partials buffer (MAX_SPLIT_K * M * N fp32) would grow with the vocabulary.
SPLIT_K_MAX_N = 16384
SUM_BLOCK = 1024  # elements per program of the split-K reduction
NORM_BLOCK_MAX = 8192  # the one-row GEMV's row-statistics pass reads rows up to this wide in one load
# 2..16 rows: the row-statistics pass's [BLOCK_M, NORM_BLOCK] block holds at most this many values a thread, so that
# it takes one pass over K = 1024 at 8 rows and 8 warps, without crowding out the weight chunk loaded before it.
NORM_THREAD_VALUES = 32
VEC = tl.constexpr(8)  # the few-rows GEMV's per-thread run along K: one 16-byte load of bf16


@triton.jit
def _x_load(x_ptrs, mask, up_offset, r_ptrs, nw_ptrs, nw_mask, GATED_X: tl.constexpr, NORM_X: tl.constexpr):
    """The raw loads behind one chunk of x (x, and up, residual, norm weight where the prologue needs them), split
    from :func:`_x_value` so the GEMV loop can issue the next chunk's loads before it computes this one's."""
    xv = tl.load(x_ptrs, mask=mask, other=0.0)
    up = xv
    rv = xv
    nw = 0.0
    if GATED_X:
        up = tl.load(x_ptrs + up_offset, mask=mask, other=0.0)
    if NORM_X:
        rv = tl.load(r_ptrs, mask=mask, other=0.0)
        nw = tl.load(nw_ptrs, mask=nw_mask, other=0.0).to(tl.float32)
    return xv, up, rv, nw


@triton.jit
def _x_value(xv, up, rv, nw, rstd, GATED_X: tl.constexpr, NORM_X: tl.constexpr):
    """x's values as the matmul consumes them, in x's dtype, from :func:`_x_load`'s loads.

    GATED_X: x rows are ``[gate | up]``: ``silu(gate) * up``, rounded as ``ce::silu_mul`` rounds (silu's output in
    x's dtype, then the product).
    NORM_X: the zero-centred RMSNorm of ``residual + x``, rounded as ``ce::add_rms_norm`` rounds (the sum in x's
    dtype, the norm in fp32, cast once); ``rstd`` and the norm weight ``nw`` (fp32) broadcast to x's tile.
    """
    if GATED_X:
        gate = xv.to(tl.float32)
        activated = (gate * tl.sigmoid(gate)).to(xv.dtype)
        xv = (activated.to(tl.float32) * up.to(tl.float32)).to(xv.dtype)
    if NORM_X:
        summed = (rv.to(tl.float32) + xv.to(tl.float32)).to(xv.dtype)
        xv = (summed.to(tl.float32) * rstd * (1.0 + nw)).to(xv.dtype)
    return xv


@triton.jit
def _residual_rstd(x, residual, summed, M, K, stride_x_m, stride_x_k, stride_r_m, eps, write_summed,
                   BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    # BLOCK_K >= K (the GEMV path's NORM_BLOCK) makes this one pass: one round trip to memory, not one per chunk.
    """NORM_X's first pass over whole rows: ``rsqrt(mean(s^2) + eps)`` [BLOCK_M] of ``s = residual + x`` (rounded to
    x's dtype), storing s to ``summed`` (contiguous [M, K]) where ``write_summed`` (one program of the grid)."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    squares = tl.zeros([BLOCK_M, BLOCK_K], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        ks = k + offs_k
        mask = m_mask[:, None] & (ks < K)[None, :]
        xv = tl.load(x + offs_m[:, None] * stride_x_m + ks[None, :] * stride_x_k, mask=mask, other=0.0)
        rv = tl.load(residual + offs_m[:, None] * stride_r_m + ks[None, :], mask=mask, other=0.0)
        s = (rv.to(tl.float32) + xv.to(tl.float32)).to(xv.dtype)
        if write_summed:
            tl.store(summed + offs_m[:, None] * K + ks[None, :], s, mask=mask)
        squares += s.to(tl.float32) * s.to(tl.float32)
    return tl.rsqrt(tl.sum(squares, axis=1) / K + eps)


@triton.jit(do_not_specialize=["M"])  # one compiled variant for every M of a path, not one for M = 16 and one else
def _skinny_gemm_kernel(
    x,
    weight,
    out,
    partials,  # [SPLIT_K (or more), M, N] fp32 when SPLIT_K > 1; unused (may be None) when SPLIT_K == 1
    M,
    N,
    K,
    stride_x_m,
    stride_x_k,
    stride_w_n,
    stride_w_k,
    stride_o_m,
    stride_o_n,
    residual,  # NORM_X: [M, K], unit stride along K; otherwise unused (x)
    norm_weight,  # NORM_X: [K]
    summed,  # NORM_X: contiguous [M, K], written with residual + x by one program
    stride_r_m,
    eps,
    BLOCK_M: tl.constexpr,  # x's rows per program, padded (masked) to a power of two; 1 only on the one-row GEMV
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    GATED_X: tl.constexpr,  # x is [M, 2K] = [gate | up] and the matmul's input is silu(gate) * up
    NORM_X: tl.constexpr,  # the matmul's input is the zero-centred RMSNorm of residual + x
    prefetch_programs,  # PREFETCH_L2: how many programs (the first ones) share the weight's L2 prefetch
    NORM_BLOCK: tl.constexpr,  # NORM_X: the row-statistics pass's block along K (the LEGACY_DOT loop: BLOCK_K)
    USE_PDL: tl.constexpr,  # launched as a programmatic dependent launch (see the module docstring)
    PREFETCH_L2: tl.constexpr,  # the weight is brought into L2 before the wait (ops/triton/l2_prefetch.py)
    DOT: tl.constexpr,  # tensor cores (tl.dot); else CUDA-core FMAs
    LEGACY_DOT: tl.constexpr,  # DOT: the autotuned path's loop (wait first, every load in the loop); A/B only
):
    if USE_PDL:
        # The next kernel on the stream, if it is launched with PDL too, may start now: its weight loads overlap
        # this kernel's instead of waiting for its tail. It waits (gdc_wait) before it reads what this one writes.
        tl.extra.cuda.gdc_launch_dependents()
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    if PREFETCH_L2:  # the whole (contiguous) weight, split over the first programs, before anything is waited for
        prefetch_l2_slab(weight, N * K * weight.dtype.element_ty.primitive_bitwidth // 8,
                         pid_k * tl.num_programs(0) + pid_n, prefetch_programs)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    m_mask = offs_m < M
    # This program's K range: a contiguous run of whole BLOCK_K chunks, so only the chunk at the end of K is ragged.
    k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    w_rows = weight + offs_n.to(tl.int64)[:, None] * stride_w_n  # int64: N * K may pass 2**31 (large vocabularies)
    x_up = K * stride_x_k  # GATED_X: where the up half of an x row starts

    if BLOCK_M == 1 and not DOT:
        # At one row this kernel is a chain of memory round trips, so every load is issued as early as it may be:
        # the first weight chunk before waiting for the earlier kernels (no kernel writes weights; with PDL they may
        # still be running); after the wait the rows' statistics in one pass over the whole row (NORM_BLOCK >= K);
        # then each iteration issues the next chunk's weight and x loads before computing the current chunk.
        ks = k_begin + offs_k
        k_mask = ks < k_end
        w = tl.load(w_rows + ks[None, :] * stride_w_k, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()  # everything the previous kernels wrote (x) is visible from here on
        rstd = 1.0
        if NORM_X:
            rstd = _residual_rstd(x, residual, summed, M, K, stride_x_m, stride_x_k, stride_r_m, eps,
                                  pid_n + pid_k == 0, 1, NORM_BLOCK)
        xv, up, rv, nw = _x_load(x + ks * stride_x_k, k_mask, x_up, residual + ks, norm_weight + ks, k_mask,
                                 GATED_X, NORM_X)
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k in range(k_begin, k_end, BLOCK_K):
            ks += BLOCK_K
            k_mask = ks < k_end
            w_next = tl.load(w_rows + ks[None, :] * stride_w_k, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            next_x = _x_load(x + ks * stride_x_k, k_mask, x_up, residual + ks, norm_weight + ks, k_mask, GATED_X,
                             NORM_X)
            acc += w.to(tl.float32) * _x_value(xv, up, rv, nw, rstd, GATED_X, NORM_X).to(tl.float32)[None, :]
            w = w_next
            xv, up, rv, nw = next_x
        result = tl.sum(acc, axis=1)[:, None]  # [BLOCK_N, 1]
    elif not DOT:
        # The GEMV at 2..8 rows: the one-row loop's order (the first weight chunk before the wait, every chunk's
        # loads one iteration ahead of its use), with the BLOCK_M rows of x in every thread beside its weights.
        # The [BLOCK_N, BLOCK_K] weight chunk and the [BLOCK_M, BLOCK_K] x chunk are reshaped to put each thread's
        # VEC contiguous K elements (one 16-byte load of bf16) on a last axis of their own, so the product's sum over
        # it stays inside the thread: the accumulator carried across iterations is [BLOCK_M, BLOCK_N, BLOCK_K / VEC],
        # VEC times smaller than the products, and no cross-thread reduction comes before the end. x and the weight
        # share one layout (no shared-memory conversion in the loop) when both spread their threads along K only:
        # BLOCK_K >= VEC x 32 x num_warps (gemv_rows_config's configs).
        ks = k_begin + offs_k
        k_mask = ks < k_end
        w = tl.load(w_rows + ks[None, :] * stride_w_k, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
        rstd = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
        if NORM_X:
            rstd = _residual_rstd(x, residual, summed, M, K, stride_x_m, stride_x_k, stride_r_m, eps,
                                  pid_n + pid_k == 0, BLOCK_M, NORM_BLOCK)
        x_rows = x + offs_m[:, None] * stride_x_m
        r_rows = residual + offs_m[:, None] * stride_r_m
        xv, up, rv, nw = _x_load(x_rows + ks[None, :] * stride_x_k, m_mask[:, None] & k_mask[None, :], x_up,
                                 r_rows + ks[None, :], norm_weight + ks[None, :], k_mask[None, :], GATED_X, NORM_X)
        acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K // VEC], dtype=tl.float32)
        for k in range(k_begin, k_end, BLOCK_K):
            ks += BLOCK_K
            k_mask = ks < k_end
            w_next = tl.load(w_rows + ks[None, :] * stride_w_k, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            next_x = _x_load(x_rows + ks[None, :] * stride_x_k, m_mask[:, None] & k_mask[None, :], x_up,
                             r_rows + ks[None, :], norm_weight + ks[None, :], k_mask[None, :], GATED_X, NORM_X)
            xf = _x_value(xv, up, rv, nw, rstd[:, None], GATED_X, NORM_X).to(tl.float32)
            wf = w.to(tl.float32)
            products = (tl.reshape(wf, [1, BLOCK_N, BLOCK_K // VEC, VEC])
                        * tl.reshape(xf, [BLOCK_M, 1, BLOCK_K // VEC, VEC]))
            acc += tl.sum(products, axis=3)
            w = w_next
            xv, up, rv, nw = next_x
        result = tl.trans(tl.sum(acc, axis=2))  # [BLOCK_N, BLOCK_M]
    elif LEGACY_DOT:
        # The autotuned path's loop, kept only for bench/gemv_chain.py's A/B against the rule: every load inside
        # the loop, after the wait, where Triton's pipeliner stages them through shared memory.
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
        rstd = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
        if NORM_X:
            rstd = _residual_rstd(x, residual, summed, M, K, stride_x_m, stride_x_k, stride_r_m, eps,
                                  pid_n + pid_k == 0, BLOCK_M, BLOCK_K)
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        x_cols = x + offs_m[None, :] * stride_x_m  # x^T: [BLOCK_K, BLOCK_M] tiles
        r_cols = residual + offs_m[None, :] * stride_r_m
        for k in range(k_begin, k_end, BLOCK_K):
            ks = k + offs_k
            k_mask = ks < k_end
            w = tl.load(w_rows + ks[None, :] * stride_w_k, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            xv, up, rv, nw = _x_load(x_cols + ks[:, None] * stride_x_k, k_mask[:, None] & m_mask[None, :], x_up,
                                     r_cols + ks[:, None], norm_weight + ks[:, None], k_mask[:, None], GATED_X,
                                     NORM_X)
            xt = _x_value(xv, up, rv, nw, rstd[None, :], GATED_X, NORM_X)
            # "ieee": fp32 inputs (the interpreter tests) multiply in fp32, not tf32; bf16/fp16 ignore the setting.
            acc = tl.dot(w, xt, acc, input_precision="ieee")
        result = acc  # [BLOCK_N, BLOCK_M]
    else:
        # Tensor cores, the weight tile as the dot's left operand ("swap AB": BLOCK_N is the MMA's M side, x's
        # BLOCK_M rows its N side, which Triton pads to the instruction's). As in the GEMV, the first weight chunk
        # is loaded before the wait, into registers; after the wait and the row statistics, the other chunks run
        # through a loop whose loads Triton's pipeliner stages through shared memory, and the first chunk's product
        # comes last, so that nothing waits on its x before the loop's loads are issued. ("ieee": fp32 inputs, in the
        # interpreter tests, multiply in fp32, not tf32; bf16 and fp16 ignore the setting.)
        ks0 = k_begin + offs_k
        k_mask0 = ks0 < k_end
        w0 = tl.load(w_rows + ks0[None, :] * stride_w_k, mask=n_mask[:, None] & k_mask0[None, :], other=0.0)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
        rstd = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
        if NORM_X:
            rstd = _residual_rstd(x, residual, summed, M, K, stride_x_m, stride_x_k, stride_r_m, eps,
                                  pid_n + pid_k == 0, BLOCK_M, NORM_BLOCK)
        x_cols = x + offs_m[None, :] * stride_x_m  # x^T: [BLOCK_K, BLOCK_M] tiles
        r_cols = residual + offs_m[None, :] * stride_r_m
        x0 = _x_load(x_cols + ks0[:, None] * stride_x_k, k_mask0[:, None] & m_mask[None, :], x_up,
                     r_cols + ks0[:, None], norm_weight + ks0[:, None], k_mask0[:, None], GATED_X, NORM_X)
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for k in range(k_begin + BLOCK_K, k_end, BLOCK_K):
            ks = k + offs_k
            k_mask = ks < k_end
            w = tl.load(w_rows + ks[None, :] * stride_w_k, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
            xv, up, rv, nw = _x_load(x_cols + ks[:, None] * stride_x_k, k_mask[:, None] & m_mask[None, :], x_up,
                                     r_cols + ks[:, None], norm_weight + ks[:, None], k_mask[:, None], GATED_X,
                                     NORM_X)
            xt = _x_value(xv, up, rv, nw, rstd[None, :], GATED_X, NORM_X)
            acc = tl.dot(w, xt, acc, input_precision="ieee")
        xv, up, rv, nw = x0
        acc = tl.dot(w0, _x_value(xv, up, rv, nw, rstd[None, :], GATED_X, NORM_X), acc, input_precision="ieee")
        result = acc  # [BLOCK_N, BLOCK_M]

    mask = n_mask[:, None] & m_mask[None, :]
    if SPLIT_K == 1:
        tl.store(out + offs_m[None, :] * stride_o_m + offs_n[:, None] * stride_o_n, result.to(out.dtype.element_ty),
                 mask=mask)
    else:
        tl.store(partials + (pid_k * M + offs_m[None, :]) * N + offs_n[:, None], result, mask=mask)


@triton.jit
def _sum_split_k_kernel(partials, out, numel, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    """out (contiguous [M, N]) = the sum of the first SPLIT_K [M, N] slices of partials, cast to out's dtype."""
    if USE_PDL:  # the next kernel may start now; the partials are read only once the matmul has finished
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.load(partials + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(partials + s * numel + offs, mask=mask, other=0.0)
    tl.store(out + offs, acc.to(out.dtype.element_ty), mask=mask)


def _sum_split_k(args: dict, exception: BaseException | None = None, pdl: dict | None = None) -> None:
    """The second pass of a split-K launch; nothing to do when SPLIT_K == 1. ``pdl``: its PDL launch flags.

    Also the autotuner's post_hook (``args``: the kernel's arguments by name, the config's included), which runs
    inside each benchmarked call, so split configs are timed with their reduction.
    """
    if exception is not None or args["SPLIT_K"] == 1:
        return
    numel = args["M"] * args["N"]
    _sum_split_k_kernel[(triton.cdiv(numel, SUM_BLOCK),)](
        args["partials"], args["out"], numel, SPLIT_K=args["SPLIT_K"], BLOCK=SUM_BLOCK, num_warps=4,
        **(pdl or {"USE_PDL": False}),
    )


def _config(block_n: int, block_k: int, split_k: int, num_warps: int, num_stages: int, block_m: int | None = None,
            dot: bool | None = None) -> triton.Config:
    """A config; ``block_m`` and ``dot`` (the path) go with it where given, else the launch's defaults apply."""
    kwargs = {"BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_K": split_k}
    if block_m is not None:
        kwargs["BLOCK_M"] = block_m
    if dot is not None:
        kwargs["DOT"] = dot
    return triton.Config(kwargs, num_warps=num_warps, num_stages=num_stages)


# M == 1 (the GEMV path): configs by rule. The rule comes from bench/gemv_chain.py: the model's 97 matmuls in model
# order, with their prologues, timed in one CUDA graph, each role's candidates tried with the others fixed; of the
# descent's alternatives only down's 4 x 2048 beat it beyond the run's noise (bench/NOTES.md, "Skinny GEMM").
GEMV_NARROW_N = 2048  # outputs up to this wide: latency-bound (4-8 MB), many programs loading K in 2,048-wide rows
GEMV_NARROW = _config(2, 2048, 1, 8, 1)  # out_proj, o_proj [1024, 2048]: whole rows in one load, 512 programs
GEMV_NARROW_LONG_K = _config(4, 2048, 1, 8, 1)  # K > 2048, down [1024, 3584]: two loads, 256 programs
GEMV_WIDE = _config(8, 256, 1, 4, 4)  # in_proj, gate_up, qkv [5120..8224, 1024]; lm_head


def gemv_config(n: int, k: int) -> triton.Config:
    """The GEMV path's config for a [n, k] weight at one row (see ``GEMV_NARROW_N``)."""
    if n <= GEMV_NARROW_N:
        return GEMV_NARROW if k <= 2048 else GEMV_NARROW_LONG_K
    return GEMV_WIDE


# Every config gemv_config may return, and a few more (the tests run them all; bench/ops_microbench.py sweeps them).
GEMV_CONFIGS = [GEMV_NARROW, GEMV_NARROW_LONG_K, GEMV_WIDE, _config(4, 1024, 1, 8, 2), _config(4, 512, 1, 4, 3),
                _config(32, 256, 1, 8, 3)]

# 2..16 rows: configs by rule too (``skinny_config``), predicted from what each path costs per program in a chain of
# dependent launches, to be checked by bench/gemv_chain.py --rows (which also times each role on the other path):
#   * the narrow outputs (N <= GEMV_NARROW_N: out_proj, o_proj, down) at 2..4 rows: the few-rows GEMV, shaped as at
#     one row (whole 2,048-wide rows in one or two loads, 256-512 programs, all resident at once). Its registers
#     grow with BLOCK_M x BLOCK_N: at 8 rows a program of 4 output columns needs more than half an SM's registers,
#     so the 256 programs no longer run in one wave (and with fewer columns a program, x's traffic and each
#     program's share of the prologue outgrow the weights');
#   * everything else on tensor cores. Every program recomputes the prologue of its whole x range, so the prologue's
#     total cost grows with the number of programs: the GEMV's registers keep its programs to a few output columns
#     (thousands of programs for the wide outputs), a tensor-core program owns 64 or 128 and streams them through
#     shared memory:
#       - the narrow outputs, past 4 rows: 64-row tiles (one wgmma) make 16 column blocks, so K is split 8 ways:
#         128 programs, each with an eighth of K's prologue (down's SiLU: two special-function operations an element,
#         a unit that runs at 1/8 of the FMA rate), then the split-K sum, a PDL launch;
#       - the wide outputs (5,120..8,224: in_proj, gate_up, qkv), 64 x 128 tiles: 80..129 programs, about one an SM;
#         8 warps, so that the norm's row statistics take one pass over K = 1,024 at 8 rows;
#       - the vocabulary, 128 x 128 tiles: bandwidth-bound, 1,940 programs.
GEMV_ROWS_MAX = 4  # the narrow outputs take the few-rows GEMV up to this many rows
DOT_NARROW_SPLIT_K = 8


def gemv_rows_config(rows: int, n: int, k: int) -> triton.Config:
    """The few-rows GEMV's config at 2..8 rows (BLOCK_M: rows rounded up to a power of two). BLOCK_K is VEC x 32 x
    num_warps, so that the threads spread along K only and x and the weight chunk share one layout (see the kernel).
    Also the bench's alternative for the roles the rule sends to tensor cores."""
    block_m = max(2, triton.next_power_of_2(rows))
    if n <= GEMV_NARROW_N:  # as at one row: 512 programs of 2-row blocks where a whole row is one load, else 256
        block_n = 2 if block_m == 2 and k <= 2048 else 4
        return _config(block_n, 2048, 1, 8, 1, block_m=block_m, dot=False)
    return _config(4, 1024, 1, 4, 1, block_m=block_m, dot=False)


def dot_config(rows: int, n: int, k: int) -> triton.Config:
    """The tensor-core path's config at 1..16 rows (BLOCK_M: rows rounded up to a power of two, at least
    DOT_MIN_BLOCK_M). Also the bench's alternative for the roles the rule sends to the GEMV."""
    block_m = max(DOT_MIN_BLOCK_M, triton.next_power_of_2(rows))
    if n <= GEMV_NARROW_N:
        return _config(64, 128, DOT_NARROW_SPLIT_K, 4, 3, block_m=block_m, dot=True)
    if n > SPLIT_K_MAX_N:
        return _config(128, 128, 1, 8, 3, block_m=block_m, dot=True)
    return _config(64, 128, 1, 8, 4, block_m=block_m, dot=True)


def skinny_config(rows: int, n: int, k: int) -> triton.Config:
    """The config ``ce::linear`` runs for ``rows`` rows of x and a [n, k] weight (the rule; see above)."""
    if rows == 1:
        return gemv_config(n, k)
    return gemv_rows_config(rows, n, k)


# The autotuned 2..16-row path, kept for one A/B against the rule (``legacy_autotune``): x padded to DOT_ROWS rows,
# the LEGACY_DOT loop, configs timed one call at a time. Few configs: each one costs a compile and a benchmark per
# (N, K) at start-up.
DOT_CONFIGS = [  # M = 2..16
    _config(16, 256, 1, 4, 4),  # N = 1024: 64 programs
    _config(32, 256, 1, 4, 3),
    _config(64, 128, 1, 4, 4),  # BLOCK_N = 64: wgmma-sized weight tile
    _config(128, 128, 1, 8, 3),  # lm_head
    _config(16, 256, 4, 4, 3),  # N = 1024: 64 column blocks x 4 splits
    _config(64, 128, 2, 4, 4),  # N = 5120..8224: 80..129 column blocks x 2
]
MAX_SPLIT_K = max(c.kwargs["SPLIT_K"] for c in GEMV_CONFIGS + DOT_CONFIGS)  # sizes the autotuned path's partials


def _prune(configs: list, named_args: dict, **kwargs) -> list:
    """Split configs only where a partials buffer was passed and K has a BLOCK_K chunk for every split."""

    def usable(c: triton.Config) -> bool:
        split, block_k = c.kwargs["SPLIT_K"], c.kwargs["BLOCK_K"]
        return split == 1 or (named_args["partials"] is not None and split <= triton.cdiv(named_args["K"], block_k))

    return [c for c in configs if usable(c)]


# Tuning results kept in Triton's cache directory, keyed by the kernel's source, the configs and the key values: a
# warm start-up skips the benchmarks, which every process otherwise reruns. Triton has the option from 3.4 on.
_CACHE_RESULTS = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}


_DOT_TUNER = triton.autotune(
    configs=DOT_CONFIGS,
    key=["N", "K", "GATED_X", "NORM_X"],
    prune_configs_by={"early_config_prune": _prune},
    post_hook=_sum_split_k,
    # Shorter than the default (25 ms warm-up, 100 ms timed) per config: a call takes 1..150 µs, so 20 ms is still
    # hundreds of timed runs.
    do_bench=functools.partial(triton.testing.do_bench, warmup=5, rep=20),
    **_CACHE_RESULTS,
)(_skinny_gemm_kernel)


def block_rows(rows: int) -> int:
    """BLOCK_M of the autotuned path's configs (GEMV_CONFIGS at one row, DOT_CONFIGS above): 1 or DOT_ROWS."""
    return 1 if rows == 1 else DOT_ROWS


def dot_autotuner():
    """The autotuned path's autotuner; its ``cache`` maps each tuned key to its pick."""
    return _DOT_TUNER


def skinny_gemm(
    x: torch.Tensor,  # [M, K] (gated: [M, 2K]), 1 <= M <= DOT_ROWS
    weight: torch.Tensor,  # [N, K], same dtype as x
    config: triton.Config | None = None,
    block_m: int | None = None,
    gated: bool = False,
    legacy_autotune: bool = False,
) -> torch.Tensor:
    """``x @ weight.T`` -> [M, N] in x's dtype, fp32 accumulation; ``gated``: ``silu_mul(x) @ weight.T``.

    ``config`` runs one fixed configuration instead of the rule's: the interpreter tests and the benchmarks use it.
    Its path comes from its ``BLOCK_M`` and ``DOT`` where it has them, else from ``block_m`` (default
    :func:`block_rows`): 1 is the one-row GEMV, DOT_ROWS the tensor cores. ``legacy_autotune`` (no ``config``): the
    autotuned path instead of the rule, for bench/gemv_chain.py's A/B.
    """
    if gated and x.shape[1] % 2:
        raise ValueError(f"a gated skinny_gemm takes x = [gate | up] with an even width, got {x.shape[1]}")
    return _launch(x, weight, config, block_m, gated=gated, legacy_autotune=legacy_autotune)


def add_rms_norm_skinny_gemm(
    x: torch.Tensor,  # [M, K], 1 <= M <= DOT_ROWS
    residual: torch.Tensor,  # [M, K], unit stride along K
    norm_weight: torch.Tensor,  # [K]
    eps: float,
    weight: torch.Tensor,  # [N, K]
    config: triton.Config | None = None,
    block_m: int | None = None,
    legacy_autotune: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(residual + x) @ weight.T, residual + x)``: a decoder layer's residual add and norm in the
    prologue of the matmul after them (``ce::add_rms_norm_linear``). Every program recomputes the rows' statistics
    from x and residual (a few KB read from L2 per program) instead of waiting for a separate norm kernel."""
    rows, k = x.shape
    if residual.shape != x.shape or residual.stride(1) != 1 or norm_weight.shape != (k,):
        raise ValueError(f"add_rms_norm_skinny_gemm: residual must be [M, K] = {tuple(x.shape)} with unit stride "
                         f"along K and norm_weight [K]; got {tuple(residual.shape)}, {tuple(norm_weight.shape)}")
    summed = x.new_empty((rows, k))
    out = _launch(x, weight, config, block_m, norm=(residual, norm_weight.contiguous(), eps, summed),
                  legacy_autotune=legacy_autotune)
    return out, summed


def _launch(x, weight, config, block_m, gated: bool = False, norm: tuple | None = None,
            legacy_autotune: bool = False) -> torch.Tensor:
    rows, k = x.shape
    k = k // 2 if gated else k
    n = weight.shape[0]
    if rows > DOT_ROWS:
        raise ValueError(f"skinny_gemm takes at most {DOT_ROWS} rows, got {rows}")
    tuned = config is None and legacy_autotune
    if tuned:
        meta, dot, block_m = {}, True, DOT_ROWS
    else:
        if config is None:
            config = skinny_config(rows, n, k)
        meta = dict(config.kwargs)
        if block_m is not None and meta.get("BLOCK_M", block_m) != block_m:
            raise ValueError(f"skinny_gemm: block_m = {block_m} against the config's BLOCK_M = {meta['BLOCK_M']}")
        block_m = meta.pop("BLOCK_M", block_m if block_m is not None else block_rows(rows))
        dot = meta.pop("DOT", block_m == DOT_ROWS)
        if not dot and block_m > 1 and meta["BLOCK_K"] % VEC.value:
            raise ValueError(f"the few-rows GEMV takes BLOCK_K in multiples of {VEC.value}, got {meta['BLOCK_K']}")
    if rows > block_m:
        raise ValueError(f"skinny_gemm with BLOCK_M = {block_m} takes at most {block_m} rows, got {rows}")
    out = x.new_empty((rows, n))
    if tuned:  # room for whichever config the tuner picks
        splits = MAX_SPLIT_K if n <= SPLIT_K_MAX_N else 1
    else:
        splits = meta["SPLIT_K"]
    partials = x.new_empty((splits, rows, n), dtype=torch.float32) if splits > 1 else None
    residual, norm_weight, eps, summed = norm if norm is not None else (x, x, 0.0, x)  # unused placeholders
    args = (x, weight, out, partials, rows, n, k, *x.stride(), *weight.stride(), *out.stride(),
            residual, norm_weight, summed, residual.stride(0), eps)
    if block_m == 1 and not dot:
        norm_block = min(triton.next_power_of_2(k), NORM_BLOCK_MAX)
    else:
        warps = config.num_warps if config is not None else 4  # the autotuned loop reads its rows by BLOCK_K
        norm_block = min(triton.next_power_of_2(k), max(1, NORM_THREAD_VALUES * 32 * warps // block_m))
    pdl = pdl_flags(x)
    flags = {"BLOCK_M": block_m, "GATED_X": gated, "NORM_X": norm is not None, "NORM_BLOCK": norm_block,
             "DOT": dot, "LEGACY_DOT": tuned, **pdl}
    if tuned:
        # Every tuned config has at least N / 128 programs: the prefetch's share is sized for that many.
        flags.update(l2_prefetch_flags(weight, triton.cdiv(n, max(c.kwargs["BLOCK_N"] for c in DOT_CONFIGS))))
        _DOT_TUNER[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"])](*args, **flags)
        split = _DOT_TUNER.best_config.kwargs["SPLIT_K"]
        sum_pdl = None  # as it was timed: a plain launch
    else:
        grid = (triton.cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"])
        flags.update(l2_prefetch_flags(weight, grid[0] * grid[1]))
        launch = {key: v for key, v in config.all_kwargs().items() if key not in ("BLOCK_M", "DOT")}
        _skinny_gemm_kernel[grid](*args, **flags, **launch)
        split = meta["SPLIT_K"]
        sum_pdl = pdl
    _sum_split_k({"partials": partials, "out": out, "M": rows, "N": n, "SPLIT_K": split}, pdl=sum_pdl)
    return out
