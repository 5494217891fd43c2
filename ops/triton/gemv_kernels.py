"""Triton kernel for ``ce::linear`` at one to five rows (decode, verify): ``out[M, N] = x[M, K] @ weight[N, K]^T``.

(and for its fused forms, ops/linear.py: ``ce::silu_mul_linear``, the same with ``silu(gate) * up`` computed from
x = ``[gate | up]`` as it loads; ``ce::add_rms_norm_linear`` at one row, with a layer's residual add and RMSNorm;
``ce::add_rms_norm_linear_silu_mul``, the MLP's gate_up with ``silu(gate) * up`` computed from its own outputs.)

Why: a decode step at batch 1-4 reads every weight once and does one to four multiply-adds per weight element, so
its weight matmuls should run at memory bandwidth; cuBLAS picks kernels made for large M on these small matrices and
is slower there. Past 5 rows ops/linear.py sends the matmuls to cuBLAS: at 6, 7, 8 and 16 rows it beat the
few-rows GEMV and the tensor-core and autotuned paths this module had for 2..16 rows (bench/NOTES.md, "Skinny GEMM"
and "Removed alternatives", has the measurements behind these choices).

Design, for bandwidth:
  * each program owns BLOCK_N weight rows (output columns) for BLOCK_M rows of x (x's M rows, padded to BLOCK_M by
    masked loads: no weight traffic) and streams them along the whole of K in BLOCK_K chunks. K is the contiguous
    axis of the row-major weight, so the loads coalesce into 16-byte vectors, and each weight element is read once
    whatever M is. Accumulation is fp32; one launch writes the output (no split of K: the rule's configs have
    hundreds to thousands of programs without one).
  * three loops, chosen by the config (BLOCK_M, DOT). Two are CUDA-core GEMVs (a multiply-add or two per weight
    element read leaves the FMA units idle most of the time; what matters is keeping loads in flight):
      - one row (BLOCK_M = 1): elementwise products summed into a [BLOCK_N, BLOCK_K] fp32 accumulator that is
        reduced once after the loop (no cross-thread reduction inside it);
      - a few rows (BLOCK_M = 2..GEMV_MAX_ROWS): the same GEMV with the BLOCK_M rows of x beside the weights in every
        thread; BLOCK_M multiply-adds per weight element, and registers that grow with BLOCK_M x BLOCK_N, hence
        the row ceiling. ops/linear.py runs it at 2-5 rows; the bench and the tests also run it up to the ceiling.
        Tiles are powers of two, so 3 rows (a k = 2 verify's) run as 2 + 1 (``EXTRA_ROW``: the last row in a
        tile of its own) rather than as 4 with a padded row's multiply-adds and conversions (the instruction
        counts: bench/NOTES.md, "The next GPU session").
    The third runs on tensor cores (DOT; BLOCK_M 8 or 16, up to DOT_MAX_ROWS rows): the product as weight @ x^T, the
    weight tile the mma's wide side, Triton's pipelined loop. It issues a fraction of an instruction per weight
    element where the few-rows GEMV issues several, which pays where the GEMV is bound by issuing them: the
    vocabulary's matmul from 3 rows (``DOT_VOCAB``). Only the GEMV loops load before the PDL wait.
  * latency, not only bandwidth: most of these matrices are 4-17 MB, 1-4 µs of DRAM time, and a launch, its
    ramp-up and its tail cost as much again. Three things hide some of it. Programmatic dependent launch
    (ops/triton/pdl.py): the kernel lets the next one start at once; the first programs prefetch the whole weight
    into L2 before waiting (ops/triton/l2_prefetch.py); and the GEMV loops load their first weight chunk, which no
    earlier kernel writes, before waiting for the earlier kernels to finish and reading x, then issue every chunk's
    loads one iteration ahead of its use.
  * full tiles at one row (``full_tiles``: BLOCK_N divides N, BLOCK_K divides K; the model's matmuls but down): the
    one-row loop loads without masks, so an iteration spends no instructions on predicates and on zeroing masked
    lanes' registers; the loop then stops a chunk short, since its look-ahead would read past the row, and the last
    chunk's product follows it. The few-rows loop always masks.
  * prologues that save a launch each: GATED_X, the MLP's down projection reads ``silu(gate) * up`` straight from
    the gate_up output (``[gate | up]`` rows) instead of a separate ``ce::silu_mul`` launch (``ce::silu_mul_linear``);
    NORM_X (one row only), a layer's residual add and RMSNorm run in the prologue of the projection after them,
    every program first summing the row's squares over the whole K (``ce::add_rms_norm_linear``). Both in
    ops/linear.py. Every program recomputes its x chunk's prologue, so its cost grows with BLOCK_M x K per program:
    from two rows the norm's share (a pass over the whole rows for their statistics, then the normed values again in
    every chunk) outweighs the hop it saves, and ops/linear.py runs ``ce::add_rms_norm`` before the GEMV instead.
  * an epilogue that saves the SiLU gate's recomputation: GATED_OUT, the MLP's gate_up projection (weight rows
    ``[gate | up]``) with each program owning matching gate and up rows (interleaved in its tile), so it writes
    ``silu(gate) * up`` itself, once per output, where GATED_X in down's prologue recomputed it in every one of
    down's programs over the whole K (down's loop has half the instructions without it, Triton 3.9 for sm_90).
  * configs: by rule (``skinny_config``: ``gemv_config`` at one row, ``gemv_rows_config`` above), from the model's
    matmul chain timed as a decode step runs it (bench/gemv_chain.py), not by ``triton.autotune``, which times each
    call alone (the L2 flushed, nothing before it) and so ranks configs wrongly for a chain of PDL launches whose
    worth depends on what they overlap. A rule also needs no tuning at start-up and never synchronises with the
    host (no tuning call to keep out of a CUDA-graph capture).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.triton.activation_kernels import silu_mul_values
from ops.triton.l2_prefetch import l2_prefetch_flags, prefetch_l2_slab
from ops.triton.pdl import pdl_flags

# The most rows a call takes: the few-rows GEMV's largest BLOCK_M. Its registers grow with BLOCK_M x BLOCK_N; at 8
# rows a program of 4 output columns already needs most of an SM's registers. ops/linear.py's SKINNY_MAX_ROWS (the
# rows it sends here rather than to cuBLAS) is at most this.
GEMV_MAX_ROWS = 8
DOT_MIN_ROWS = 8  # the tensor-core loop's smallest BLOCK_M (mma's narrow side)
DOT_MAX_ROWS = 16  # and its largest
NORM_BLOCK_MAX = 8192  # the one-row GEMV's row-statistics pass reads rows up to this wide in one load
VEC = tl.constexpr(8)  # the few-rows GEMV's per-thread run along K: one 16-byte load of bf16


@triton.jit
def _load(ptrs, mask, FULL: tl.constexpr):
    """``ptrs``' values, 0 where ``mask`` is false; FULL (the launch's tiles all lie inside the tensors): no mask,
    so the loop spends no instructions on predicates and on zeroing the registers of masked lanes."""
    if FULL:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _x_load(x_ptrs, mask, up_offset, r_ptrs, nw_ptrs, nw_mask, GATED_X: tl.constexpr, NORM_X: tl.constexpr,
            FULL: tl.constexpr):
    """The raw loads behind one chunk of x (x, and up, residual, norm weight where the prologue needs them), split
    from :func:`_x_value` so the GEMV loop can issue the next chunk's loads before it computes this one's."""
    xv = _load(x_ptrs, mask, FULL)
    up = xv
    rv = xv
    nw = 0.0
    if GATED_X:
        up = _load(x_ptrs + up_offset, mask, FULL)
    if NORM_X:
        rv = _load(r_ptrs, mask, FULL)
        nw = _load(nw_ptrs, nw_mask, FULL).to(tl.float32)
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
        xv = silu_mul_values(xv, up, xv.dtype)
    if NORM_X:
        summed = (rv.to(tl.float32) + xv.to(tl.float32)).to(xv.dtype)
        xv = (summed.to(tl.float32) * rstd * (1.0 + nw)).to(xv.dtype)
    return xv


@triton.jit
def _residual_rstd(x, residual, summed, M, K, stride_x_m, stride_x_k, stride_r_m, eps, write_summed,
                   BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    # BLOCK_K >= K (the GEMV path's NORM_BLOCK) makes this one pass: one round trip to memory, not one per chunk.
    """NORM_X's first pass over whole rows: ``rsqrt(mean(s^2) + eps)`` [BLOCK_M] of ``s = residual + x`` (rounded to
    x's dtype), storing s to ``summed`` (contiguous [M, K]) where ``write_summed`` (one program of the grid). The
    kernel calls it with BLOCK_M = 1: the norm prologue runs at one row only."""
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


@triton.jit
def _eighths(t, A: tl.constexpr, B: tl.constexpr, C: tl.constexpr):
    """``t`` (A x B x C x 8 elements, each thread holding whole runs of 8 along its last axis) as the eight [A, B, C]
    tensors of a run's elements: split in halves three times, all inside each thread's registers."""
    t0, t1 = tl.split(tl.reshape(t, [A, B, C, 4, 2]))
    t00, t01 = tl.split(tl.reshape(t0, [A, B, C, 2, 2]))
    t10, t11 = tl.split(tl.reshape(t1, [A, B, C, 2, 2]))
    e0, e1 = tl.split(t00)
    e2, e3 = tl.split(t01)
    e4, e5 = tl.split(t10)
    e6, e7 = tl.split(t11)
    return e0, e1, e2, e3, e4, e5, e6, e7


@triton.jit
def fma_runs(acc, w, x, W_A: tl.constexpr, W_B: tl.constexpr, X_A: tl.constexpr, X_B: tl.constexpr,
             C: tl.constexpr):
    """``acc`` [A, B, C] plus the sums over each run of VEC (8) contiguous K elements of ``w`` (viewed [W_A, W_B, C *
    VEC]) times ``x`` (viewed [X_A, X_B, C * VEC]), broadcast to [A, B]: one FMA a product. A ``tl.sum`` of the
    [.., VEC] products may compile to a multiply each and a tree of adds, with the products live in registers: more
    instructions and registers a chunk, what a loop's cost grows with at several rows (bench/NOTES.md, "Runs
    63-66")."""
    tl.static_assert(VEC == 8)
    w0, w1, w2, w3, w4, w5, w6, w7 = _eighths(w.to(tl.float32), W_A, W_B, C)
    x0, x1, x2, x3, x4, x5, x6, x7 = _eighths(x.to(tl.float32), X_A, X_B, C)
    acc += w0 * x0
    acc += w1 * x1
    acc += w2 * x2
    acc += w3 * x3
    acc += w4 * x4
    acc += w5 * x5
    acc += w6 * x6
    acc += w7 * x7
    return acc


@triton.jit
def _epilogue(result, pid_n, N, dtype: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
              GATED_OUT: tl.constexpr):
    """The program's outputs from its fp32 sums ``result`` [BLOCK_N, ROWS]: (values in ``dtype``, their columns,
    the columns' mask). GATED_OUT: the sums are interleaved gate / up pairs (see the kernel); the values are
    ``silu(gate) * up``, rounded as ``ce::silu_mul`` rounds a gate_up output (gate and up in ``dtype``, silu's
    output in ``dtype``, then the product), BLOCK_N / 2 columns of an [M, N / 2] output."""
    if GATED_OUT:
        pairs = tl.reshape(result.to(dtype), [BLOCK_N // 2, 2, ROWS])
        gate, up = tl.split(tl.permute(pairs, (0, 2, 1)))
        values = silu_mul_values(gate, up, dtype)
        cols = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        c_mask = cols < N // 2
    else:
        values = result.to(dtype)
        cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        c_mask = cols < N
    return values, cols, c_mask


@triton.jit(do_not_specialize=["M"])  # one compiled variant for every M of a BLOCK_M (else M == 1 is its own)
def _skinny_gemm_kernel(
    x,
    weight,
    out,
    M,
    N,
    K,
    stride_x_m,
    stride_x_k,
    stride_w_n,
    stride_w_k,
    stride_o_m,
    stride_o_n,
    residual,  # NORM_X: [1, K], unit stride along K; otherwise unused (x)
    norm_weight,  # NORM_X: [K]
    summed,  # NORM_X: contiguous [1, K], written with residual + x by one program
    stride_r_m,
    eps,
    BLOCK_M: tl.constexpr,  # x's rows per program, padded (masked) to a power of two; 1: the one-row loop
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GATED_X: tl.constexpr,  # x is [M, 2K] = [gate | up] and the matmul's input is silu(gate) * up
    NORM_X: tl.constexpr,  # the matmul's input is the zero-centred RMSNorm of residual + x (BLOCK_M == 1 only)
    prefetch_programs,  # PREFETCH_L2: how many programs (the first ones) share the weight's L2 prefetch
    NORM_BLOCK: tl.constexpr,  # NORM_X: the row-statistics pass's block along K
    USE_PDL: tl.constexpr,  # launched as a programmatic dependent launch (see the module docstring)
    PREFETCH_L2: tl.constexpr,  # the weight is brought into L2 before the wait (ops/triton/l2_prefetch.py)
    DOT: tl.constexpr = False,  # the tensor-core loop (BLOCK_M 8 or 16) instead of the few-rows GEMV
    EXTRA_ROW: tl.constexpr = False,  # the few-rows GEMV: M = BLOCK_M + 1, the last row in a tile of its own
    FULL: tl.constexpr = False,  # the one-row loop: every tile lies inside x and the weight (``full_tiles``)
    GATED_OUT: tl.constexpr = False,  # the weight's rows are [gate | up]; out is silu(gate) * up, N / 2 columns
):
    if USE_PDL:
        # The next kernel on the stream, if it is launched with PDL too, may start now: its weight loads overlap
        # this kernel's instead of waiting for its tail. It waits (gdc_wait) before it reads what this one writes.
        tl.extra.cuda.gdc_launch_dependents()
    pid_n = tl.program_id(0)
    if PREFETCH_L2:  # the whole (contiguous) weight, split over the first programs, before anything is waited for
        prefetch_l2_slab(weight, N * K * weight.dtype.element_ty.primitive_bitwidth // 8, pid_n, prefetch_programs)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    if GATED_OUT:
        # The program's BLOCK_N weight rows are BLOCK_N / 2 gate rows and the matching up rows, interleaved (row 2i
        # gate column j, row 2i + 1 up column j), so that its epilogue holds both factors of each of its outputs.
        offs_n = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N) // 2
        n_mask = offs_n < N // 2
        offs_n += (tl.arange(0, BLOCK_N) % 2) * (N // 2)
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    w_rows = weight + offs_n.to(tl.int64)[:, None] * stride_w_n  # int64: N * K may pass 2**31 (large vocabularies)
    x_up = K * stride_x_k  # GATED_X: where the up half of an x row starts

    if BLOCK_M == 1:
        # At one row this kernel is a chain of memory round trips, so every load is issued as early as it may be:
        # the first weight chunk before waiting for the earlier kernels (no kernel writes weights; with PDL they may
        # still be running); after the wait the first x chunk's loads, then (NORM_X) the row's statistics in one
        # pass over the whole row (NORM_BLOCK >= K), so that the chunk's loads are in flight with the pass's rather
        # than issued after its reduction; then each iteration issues the next chunk's weight and x loads before
        # computing the current chunk. FULL: no masks, and the loop stops a chunk early (its look-ahead would read
        # past the row); the last chunk's product follows it.
        ks = offs_k
        k_mask = ks < K
        w = _load(w_rows + ks[None, :] * stride_w_k, n_mask[:, None] & k_mask[None, :], FULL)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()  # everything the previous kernels wrote (x) is visible from here on
        xv, up, rv, nw = _x_load(x + ks * stride_x_k, k_mask, x_up, residual + ks, norm_weight + ks, k_mask,
                                 GATED_X, NORM_X, FULL)
        rstd = 1.0
        if NORM_X:
            rstd = _residual_rstd(x, residual, summed, M, K, stride_x_m, stride_x_k, stride_r_m, eps,
                                  pid_n == 0, 1, NORM_BLOCK)
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        k_end = K
        if FULL:
            k_end = K - BLOCK_K
        for k in range(0, k_end, BLOCK_K):
            ks += BLOCK_K
            k_mask = ks < K
            w_next = _load(w_rows + ks[None, :] * stride_w_k, n_mask[:, None] & k_mask[None, :], FULL)
            next_x = _x_load(x + ks * stride_x_k, k_mask, x_up, residual + ks, norm_weight + ks, k_mask, GATED_X,
                             NORM_X, FULL)
            acc += w.to(tl.float32) * _x_value(xv, up, rv, nw, rstd, GATED_X, NORM_X).to(tl.float32)[None, :]
            w = w_next
            xv, up, rv, nw = next_x
        if FULL:
            acc += w.to(tl.float32) * _x_value(xv, up, rv, nw, rstd, GATED_X, NORM_X).to(tl.float32)[None, :]
        result = tl.sum(acc, axis=1)[:, None]  # [BLOCK_N, 1]
    else:
        # 2..16 rows, on one of two loops after the same start (the wait):
        # - the GEMV at 2..8 rows: the one-row loop's order (the first weight chunk before the wait, every chunk's
        #   loads one iteration ahead of its use), with the BLOCK_M rows of x in every thread beside its weights.
        #   The [BLOCK_N, BLOCK_K] weight chunk and the [BLOCK_M, BLOCK_K] x chunk are reshaped to put each thread's
        #   VEC contiguous K elements (one 16-byte load of bf16) on a last axis of their own, so the product's sum
        #   over it stays inside the thread: the accumulator carried across iterations is [BLOCK_M, BLOCK_N, BLOCK_K
        #   / VEC], VEC times smaller than the products, and no cross-thread reduction comes before the end. x and the
        #   weight share one layout (no shared-memory conversion in the loop) when both spread their threads along K
        #   only: BLOCK_K >= VEC x 32 x num_warps (gemv_rows_config's configs);
        # - DOT, tensor cores: the product computed as weight @ x^T, the weight tile (BLOCK_N rows) the wide side and
        #   x's rows, padded to BLOCK_M (8 or 16), the narrow one. Per weight element a program issues a fraction of
        #   an instruction (its share of a cp.async, an ldmatrix and an mma), where the GEMV issues BLOCK_M
        #   multiply-adds and its conversions. The weight is prefetched into L2 before the wait (PREFETCH_L2);
        #   Triton's pipeliner issues the chunks' loads after it.
        tl.static_assert(not NORM_X, "the norm prologue runs at one row only (ops/linear.py: apart from two rows)")
        ks = offs_k
        k_mask = ks < K
        if not DOT:
            w = tl.load(w_rows + ks[None, :] * stride_w_k, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
        x_rows = x + offs_m[:, None] * stride_x_m
        if DOT:
            acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
            for k in range(0, K, BLOCK_K):
                ks = k + offs_k
                k_mask = ks < K
                w = tl.load(w_rows + ks[None, :] * stride_w_k, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
                x_ptrs = x_rows + ks[None, :] * stride_x_k
                xv, up, rv, nw = _x_load(x_ptrs, m_mask[:, None] & k_mask[None, :], x_up, x_ptrs, x_ptrs, None,
                                         GATED_X, False, False)
                xv = _x_value(xv, up, rv, nw, 1.0, GATED_X, False)
                acc = tl.dot(w, tl.trans(xv), acc)
            result = acc  # [BLOCK_N, BLOCK_M]
        else:
            # EXTRA_ROW: x's row BLOCK_M too, as a [1, BLOCK_K] tile with an accumulator of its own (three rows as
            # two and one: no padded fourth row's multiply-adds and conversions).
            x_ptrs = x_rows + ks[None, :] * stride_x_k
            xv, up, rv, nw = _x_load(x_ptrs, m_mask[:, None] & k_mask[None, :], x_up, x_ptrs, x_ptrs, None, GATED_X,
                                     False, False)
            acc = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K // VEC], dtype=tl.float32)
            if EXTRA_ROW:
                e_row = x + BLOCK_M * stride_x_m
                e_ptrs = e_row + ks[None, :] * stride_x_k
                ev, eup, erv, enw = _x_load(e_ptrs, k_mask[None, :], x_up, e_ptrs, e_ptrs, None, GATED_X, False, False)
                acc_e = tl.zeros([1, BLOCK_N, BLOCK_K // VEC], dtype=tl.float32)
            for k in range(0, K, BLOCK_K):
                ks += BLOCK_K
                k_mask = ks < K
                w_next = tl.load(w_rows + ks[None, :] * stride_w_k, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
                x_ptrs = x_rows + ks[None, :] * stride_x_k
                next_x = _x_load(x_ptrs, m_mask[:, None] & k_mask[None, :], x_up, x_ptrs, x_ptrs, None, GATED_X,
                                 False, False)
                xf = _x_value(xv, up, rv, nw, 1.0, GATED_X, False).to(tl.float32)
                acc = fma_runs(acc, w, xf, 1, BLOCK_N, BLOCK_M, 1, BLOCK_K // VEC)
                if EXTRA_ROW:
                    e_ptrs = e_row + ks[None, :] * stride_x_k
                    next_e = _x_load(e_ptrs, k_mask[None, :], x_up, e_ptrs, e_ptrs, None, GATED_X, False, False)
                    ef = _x_value(ev, eup, erv, enw, 1.0, GATED_X, False).to(tl.float32)
                    acc_e = fma_runs(acc_e, w, ef, 1, BLOCK_N, 1, 1, BLOCK_K // VEC)
                    ev, eup, erv, enw = next_e
                w = w_next
                xv, up, rv, nw = next_x
            result = tl.trans(tl.sum(acc, axis=2))  # [BLOCK_N, BLOCK_M]
            if EXTRA_ROW:
                values, cols, c_mask = _epilogue(tl.trans(tl.sum(acc_e, axis=2)), pid_n, N, out.dtype.element_ty,
                                                 BLOCK_N, 1, GATED_OUT)
                tl.store(out + BLOCK_M * stride_o_m + cols[:, None] * stride_o_n, values, mask=c_mask[:, None])

    values, cols, c_mask = _epilogue(result, pid_n, N, out.dtype.element_ty, BLOCK_N, BLOCK_M, GATED_OUT)
    tl.store(out + offs_m[None, :] * stride_o_m + cols[:, None] * stride_o_n, values,
             mask=c_mask[:, None] & m_mask[None, :])


def _config(block_n: int, block_k: int, num_warps: int, num_stages: int, block_m: int | None = None,
            maxnreg: int | None = None, dot: bool = False) -> triton.Config:
    """A config; ``block_m`` goes with it where given, else the launch takes BLOCK_M from the row count. ``maxnreg``:
    a cap on the registers a thread may use (ptxas's ``.maxnreg``), so that more programs fit on an SM. ``dot``: the
    tensor-core loop (BLOCK_M 8 or 16)."""
    kwargs = {"BLOCK_N": block_n, "BLOCK_K": block_k}
    if block_m is not None:
        kwargs["BLOCK_M"] = block_m
    if dot:
        kwargs["DOT"] = True
    return triton.Config(kwargs, num_warps=num_warps, num_stages=num_stages, maxnreg=maxnreg)


# M == 1 (the one-row GEMV): configs by rule. The rule comes from bench/gemv_chain.py: the model's 97 matmuls in
# model order, with their prologues, timed in one CUDA graph, each role's candidates tried with the others fixed; of
# the descent's alternatives only down's 4 x 2048 beat it beyond the run's noise (bench/NOTES.md, "Skinny GEMM").
GEMV_NARROW_N = 2048  # outputs up to this wide: latency-bound (4-8 MB), many programs loading K in 2,048-wide rows
GEMV_NARROW = _config(2, 2048, 8, 1)  # out_proj, o_proj [1024, 2048]: whole rows in one load, 512 programs
GEMV_NARROW_LONG_K = _config(4, 2048, 8, 1)  # K > 2048, down [1024, 3584]: two loads, 256 programs
GEMV_WIDE = _config(8, 256, 4, 4)  # in_proj, gate_up, qkv [5120..8224, 1024]; lm_head


def gemv_config(n: int, k: int) -> triton.Config:
    """The one-row GEMV's config for a [n, k] weight (see ``GEMV_NARROW_N``)."""
    if n <= GEMV_NARROW_N:
        return GEMV_NARROW if k <= 2048 else GEMV_NARROW_LONG_K
    return GEMV_WIDE


# Every config gemv_config may return, and a few more (the tests run them all; bench/ops_microbench.py sweeps them).
GEMV_CONFIGS = [GEMV_NARROW, GEMV_NARROW_LONG_K, GEMV_WIDE, _config(4, 1024, 8, 2), _config(4, 512, 4, 3),
                _config(32, 256, 8, 3)]


# 2..GEMV_MAX_ROWS rows (ops/linear.py: up to 5): the few-rows GEMV. Narrow outputs (N <= GEMV_NARROW_N: out_proj,
# o_proj, down) load whole 2,048-wide rows in one or two chunks, 4 columns a program (8 past K = 2,048: 128 programs
# of two chunks); wide ones loop over K in 512-wide chunks of 8 columns with 2 warps, each chunk's loads issued one
# iteration ahead (2-4x the programs of a whole-K tile, each with less in registers). Each weight element is read
# once for all the rows, as at one row. The tiles come from bench/gemv_chain.py's descent at 2 rows; why 4 rows and
# not more: bench/NOTES.md, "Skinny GEMM".
def gemv_rows_config(rows: int, n: int, k: int) -> triton.Config:
    """The few-rows GEMV's config at 2..GEMV_MAX_ROWS rows (BLOCK_M: rows rounded up to a power of two). BLOCK_K is
    VEC x 32 x num_warps, so that the threads spread along K only and x and the weight chunk share one layout (see
    the kernel)."""
    block_m = max(2, triton.next_power_of_2(rows))
    most_n = 32 // block_m  # BLOCK_M x BLOCK_N fp32 accumulators a thread: past 32 they spill
    if n <= GEMV_NARROW_N:
        return _config(min(4 if k <= 2048 else 8, most_n), 2048, 8, 1, block_m=block_m)
    # At 4 rows 128 registers at most (8 programs an SM hold 1,056: one wave for in_proj, gate_up and qkv). The cap
    # was set for the norm prologue's variant (144 registers uncapped, ptxas, Triton 3.6, sm_90: 7 programs an SM,
    # fewer than in_proj's 1,028 programs); the prologue-free GEMV these roles run since the norm went apart takes
    # 128 uncapped (Triton 3.9 offline; not checked on 3.6), so there it only guards against a compiler that wants
    # more.
    return _config(min(8, most_n), 512, 2, 1, block_m=block_m, maxnreg=128 if block_m == 4 else None)


# The vocabulary's matmul (lm_head: N in the hundred thousands, a shard of it under tensor parallelism) at 3 or more
# rows: the tensor-core loop, 128 x 128 tiles of 4 warps (wgmma) in a 3-stage pipeline. There the few-rows GEMV issues
# ~BLOCK_M multiply-adds and conversions a weight element and is bound by issuing them (Nsight Compute, 4 rows: 73%
# of issue slots busy, 72% of DRAM bandwidth, against 90% at one row); the tensor-core loop reads the weight at the
# bandwidth, 22-25 µs a step less at 3-4 rows (at 2 rows level with the GEMV: bench/NOTES.md, "Skinny GEMM"). On
# the model's other matmuls, 4-17 MB each, it lost to the GEMV at every tile tried.
DOT_VOCAB_MIN_N = 65536
DOT_VOCAB_MIN_ROWS = 3
DOT_VOCAB = _config(128, 128, 4, 3, dot=True)


def skinny_config(rows: int, n: int, k: int) -> triton.Config:
    """The config ``ce::linear`` runs for ``rows`` rows of x and a [n, k] weight (the rule; see above)."""
    if rows == 1:
        return gemv_config(n, k)
    if n >= DOT_VOCAB_MIN_N and rows >= DOT_VOCAB_MIN_ROWS:
        return DOT_VOCAB
    return gemv_rows_config(rows, n, k)


def skinny_gemm(
    x: torch.Tensor,  # [M, K] (gated: [M, 2K]), 1 <= M <= GEMV_MAX_ROWS
    weight: torch.Tensor,  # [N, K], same dtype as x
    config: triton.Config | None = None,
    gated: bool = False,
    gated_out: bool = False,
) -> torch.Tensor:
    """``x @ weight.T`` -> [M, N] in x's dtype, fp32 accumulation; ``gated``: ``silu_mul(x) @ weight.T``;
    ``gated_out``: ``silu_mul(x @ weight.T)`` -> [M, N / 2], the weight's rows ``[gate | up]`` (the MLP's gate_up).

    ``config`` runs one fixed configuration instead of the rule's: the interpreter tests and the benchmarks use it.
    Its ``BLOCK_M`` chooses the loop (1: the one-row GEMV; 2, 4, 8: the few-rows GEMV); a config without one runs at
    the row count's (1 at one row, else the row count rounded up to a power of two).
    """
    if gated and x.shape[1] % 2:
        raise ValueError(f"a gated skinny_gemm takes x = [gate | up] with an even width, got {x.shape[1]}")
    return _launch(x, weight, config, gated=gated, gated_out=gated_out)


def add_rms_norm_skinny_gemm(
    x: torch.Tensor,  # [1, K]
    residual: torch.Tensor,  # [1, K], unit stride along K
    norm_weight: torch.Tensor,  # [K]
    eps: float,
    weight: torch.Tensor,  # [N, K]
    config: triton.Config | None = None,
    gated_out: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(residual + x) @ weight.T, residual + x)`` for one row: a decoder layer's residual add and norm in
    the prologue of the matmul after them (``ce::add_rms_norm_linear`` at one row; ``gated_out``: with the SiLU gate
    as ``skinny_gemm``'s, ``ce::add_rms_norm_linear_silu_mul``). Every program recomputes the row's
    statistics from x and residual (a few KB read from L2 per program) instead of waiting for a separate norm
    kernel. From two rows that recomputation costs more than the hop (see the module docstring): ValueError."""
    rows, k = x.shape
    if rows != 1:
        raise ValueError(f"add_rms_norm_skinny_gemm runs the one-row GEMV, got {rows} rows: from two rows the norm "
                         f"runs apart (ce::add_rms_norm, ops/linear.py)")
    if residual.shape != x.shape or residual.stride(1) != 1 or norm_weight.shape != (k,):
        raise ValueError(f"add_rms_norm_skinny_gemm: residual must be [1, K] = {tuple(x.shape)} with unit stride "
                         f"along K and norm_weight [K]; got {tuple(residual.shape)}, {tuple(norm_weight.shape)}")
    summed = x.new_empty((rows, k))
    out = _launch(x, weight, config, norm=(residual, norm_weight.contiguous(), eps, summed), gated_out=gated_out)
    return out, summed


def row_tiles(rows: int, config: triton.Config) -> dict:
    """The kernel's row constexprs for ``rows`` rows under ``config`` (ValueError where it cannot take them): DOT,
    BLOCK_M (the config's, else the row count's power of two: 1 at one row, at least 2 on the few-rows GEMV, at
    least DOT_MIN_ROWS on tensor cores) and EXTRA_ROW: one row past a power of two (3, 5) on the few-rows GEMV runs
    that power's tile and the last row apart, not a tile of twice the rows, half of it padding."""
    dot = config.kwargs.get("DOT", False)
    if rows > (DOT_MAX_ROWS if dot else GEMV_MAX_ROWS):
        raise ValueError(f"skinny_gemm takes at most {GEMV_MAX_ROWS} rows ({DOT_MAX_ROWS} on tensor cores), got {rows}")
    block_m = config.kwargs.get("BLOCK_M", max(DOT_MIN_ROWS, triton.next_power_of_2(rows)) if dot
                                else 1 if rows == 1 else max(2, triton.next_power_of_2(rows)))
    if rows > block_m:
        raise ValueError(f"skinny_gemm with BLOCK_M = {block_m} takes at most {block_m} rows, got {rows}")
    if dot and block_m < DOT_MIN_ROWS:
        raise ValueError(f"the tensor-core loop takes BLOCK_M >= {DOT_MIN_ROWS}, got {block_m}")
    if block_m > 1 and not dot and config.kwargs["BLOCK_K"] % VEC.value:
        raise ValueError(f"the few-rows GEMV takes BLOCK_K in multiples of {VEC.value}, got {config.kwargs['BLOCK_K']}")
    extra_row = block_m > 2 and not dot and rows == block_m // 2 + 1
    return {"DOT": dot, "BLOCK_M": block_m // 2 if extra_row else block_m, "EXTRA_ROW": extra_row}


# Whether the one-row GEMV loop drops its masks where every tile is full (``full_tiles``); off, it masks every load.
FULL_TILES = True


def full_tiles(rows: int, n: int, k: int, config: triton.Config, tiles: dict) -> bool:
    """Whether a one-row GEMV launch's tiles all lie inside x and the weight: BLOCK_N divides N and BLOCK_K divides
    K. The model's matmuls all do but those with K = 3,584 (down), whose 2,048-wide chunks leave a ragged last one.
    The few-rows loop masks every load (its unmasked form lost: bench/NOTES.md, "Removed alternatives")."""
    kw = config.kwargs
    return (FULL_TILES and rows == 1 and tiles["BLOCK_M"] == 1 and n % kw["BLOCK_N"] == 0
            and k % kw["BLOCK_K"] == 0)


def takes_gated_out(rows: int, n: int, k: int) -> bool:
    """Whether the rule's config for ``rows`` rows of a [n, k] weight can write ``silu(gate) * up`` (``gated_out``):
    an even n on the GEMV loops (the tensor-core loop, the vocabulary's from 3 rows, has no such epilogue)."""
    return n % 2 == 0 and not row_tiles(rows, skinny_config(rows, n, k))["DOT"]


def _launch(x, weight, config, gated: bool = False, norm: tuple | None = None,
            gated_out: bool = False) -> torch.Tensor:
    rows, k = x.shape
    k = k // 2 if gated else k
    n = weight.shape[0]
    if gated_out and n % 2:
        raise ValueError(f"a gated_out skinny_gemm takes a weight of [gate | up] rows, an even number; got {n}")
    if config is None:
        config = skinny_config(rows, n, k)
    tiles = row_tiles(rows, config)
    if gated_out and (tiles["DOT"] or config.kwargs["BLOCK_N"] % 2):
        raise ValueError(f"gated_out runs the GEMV loops with an even BLOCK_N (gate and up rows in pairs), got "
                         f"{config.kwargs} (num_warps {config.num_warps})")
    if norm is not None and tiles["BLOCK_M"] != 1:
        raise ValueError(f"add_rms_norm_skinny_gemm runs the one-row GEMV (BLOCK_M = 1), got a config with "
                         f"BLOCK_M = {tiles['BLOCK_M']}: from two rows the norm runs apart (ce::add_rms_norm, "
                         f"ops/linear.py)")
    out = x.new_empty((rows, n // 2 if gated_out else n))
    residual, norm_weight, eps, summed = norm if norm is not None else (x, x, 0.0, x)  # unused placeholders
    args = (x, weight, out, rows, n, k, *x.stride(), *weight.stride(), *out.stride(),
            residual, norm_weight, summed, residual.stride(0), eps)
    norm_block = min(triton.next_power_of_2(k), NORM_BLOCK_MAX) if norm is not None else 1
    grid = (triton.cdiv(n, config.kwargs["BLOCK_N"]),)
    flags = {**tiles, "FULL": full_tiles(rows, n, k, config, tiles), "GATED_X": gated, "GATED_OUT": gated_out,
             "NORM_X": norm is not None, "NORM_BLOCK": norm_block, **pdl_flags(x), **l2_prefetch_flags(weight, grid[0])}
    launch = {key: v for key, v in config.all_kwargs().items() if key not in ("BLOCK_M", "DOT")}
    _skinny_gemm_kernel[grid](*args, **flags, **launch)
    return out
