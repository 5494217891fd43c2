"""Triton kernel for ``ce::linear`` at few rows (decode): ``out[M, N] = x[M, K] @ weight[N, K]^T``, M = 1..16.

(and for ``ce::silu_mul_linear``: the same with ``silu(gate) * up`` computed from x = ``[gate | up]`` as it loads.)

Why: a decode step at batch 1..16 reads every weight once and does M multiply-adds per weight element, so its weight
matmuls should run at memory bandwidth. cuBLAS picks kernels made for large M on these small matrices: 0.94 ms for
the 97 matmuls of a Qwen3.5-0.8B step at batch 1 on an H200, 37.5% of the bandwidth bound.

Design, for bandwidth:
  * each program owns BLOCK_N weight rows (output columns) for all M rows of x and streams them along K in BLOCK_K
    chunks. K is the contiguous axis of the row-major weight, so the loads coalesce into 16-byte vectors, and each
    weight element is read once whatever M is. Accumulation is fp32.
  * M == 1 (BLOCK_M = 1): a CUDA-core GEMV, elementwise products summed into a [BLOCK_N, BLOCK_K] fp32
    accumulator that is reduced once after the loop (no cross-thread reduction inside it).
  * M = 2..16 (BLOCK_M = 16): tensor cores. At M = 16, keeping up with 4.3 TB/s of bf16 weights takes 69 TFLOP/s,
    about the H200's whole fp32 CUDA-core peak. ``tl.dot`` needs every dimension >= 16, so x's rows are padded to
    16 by masked loads; x is tiny, so this costs no weight traffic. The weight tile is the dot's left operand
    ("swap AB"): its long side BLOCK_N is the MMA's M side (Hopper's wgmma wants 64 there), the 16 padded rows its
    N side.
  * split-K: at N = 1024 (out_proj, down_proj, o_proj) blocks of 16 columns make only 64 programs for 132 SMs.
    With SPLIT_K > 1, SPLIT_K programs per column block each take a contiguous 1/SPLIT_K of K and write fp32
    partial sums to ``partials[SPLIT_K, M, N]``; a second small kernel adds them up and casts. No atomics, no
    memset: every program writes its whole partial tile, zeros for an empty K range included. SPLIT_K == 1 writes
    the output directly, in one launch.
  * latency, not only bandwidth: most of these matrices are 4-17 MB, 1-4 µs of DRAM time, and a launch, its
    ramp-up and its tail cost ~3 µs more (bench/gemv_sweep.py). Three things hide some of it. Programmatic dependent
    launch (ops/triton/pdl.py): the kernel lets the next one start at once; the first programs prefetch the whole
    weight into L2 before waiting (ops/triton/l2_prefetch.py); and (GEMV path) it loads its first weight chunk,
    which no earlier kernel writes, before waiting for the earlier kernels to finish and reading x, then issues
    every chunk's load one iteration ahead of its use.
  * prologues that save a launch each: GATED_X, the MLP's down projection reads ``silu(gate) * up`` straight from
    the gate_up output (``[gate | up]`` rows) instead of a separate ``ce::silu_mul`` launch (``ce::silu_mul_linear``);
    NORM_X, a layer's residual add and RMSNorm run in the prologue of the projection after them, every program
    first summing its rows' squares over the whole K (``ce::add_rms_norm_linear``). Both in ops/linear.py.
  * configs: at one row (the GEMV path) by rule (``gemv_config``), from the model's matmul chain timed as a decode
    step runs it (bench/gemv_chain.py); at 2..16 rows by ``triton.autotune`` over a few configs, keyed on (N, K,
    GATED_X, NORM_X); triton adds the argument dtypes to the key. The split configs' timings include the reduction
    launch (it runs as the autotuner's post_hook, inside the timed call), so a split wins only if it pays for its
    second launch. The benchmark flushes the L2 before each run (``triton.testing.do_bench``): in a decode step the
    1.5 GB of weights never stay in the 50 MB L2.

Tuning runs on the first call of each key and synchronises with the host, so it must not happen inside a CUDA-graph
capture: in the engine the first call of each shape is the eager warm-up run of its decode bucket, before capture.
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

DOT_ROWS = 16  # tl.dot needs every dimension >= 16: 2..16 rows of x are padded to 16
# Widest output for which split configs are tried. Past it every config has well over 132 programs without a split
# (lm_head: N = 248320), and the partials buffer (MAX_SPLIT_K * M * N fp32) would grow with the vocabulary.
SPLIT_K_MAX_N = 16384
SUM_BLOCK = 1024  # elements per program of the split-K reduction
NORM_BLOCK_MAX = 8192  # the GEMV path's row-statistics pass reads rows up to this wide in one load


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
    BLOCK_M: tl.constexpr,  # 1: CUDA-core GEMV; 16: tensor cores, x's rows padded to 16
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    GATED_X: tl.constexpr,  # x is [M, 2K] = [gate | up] and the matmul's input is silu(gate) * up
    NORM_X: tl.constexpr,  # the matmul's input is the zero-centred RMSNorm of residual + x
    prefetch_programs,  # PREFETCH_L2: how many programs (the first ones) share the weight's L2 prefetch
    NORM_BLOCK: tl.constexpr,  # NORM_X, GEMV path: the row-statistics pass's block, >= K where K allows
    USE_PDL: tl.constexpr,  # launched as a programmatic dependent launch (see the module docstring)
    PREFETCH_L2: tl.constexpr,  # the weight is brought into L2 before the wait (ops/triton/l2_prefetch.py)
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

    if BLOCK_M == 1:
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
    else:
        # The tensor-core path keeps its loads inside the loop, where Triton's pipeliner stages them through shared
        # memory. (A tile carried across iterations, as the GEMV path's, measured no better at batch 8: 23.6% of the
        # bound in bench/results/h200-2026-11-29/run15-session against 24.3% with this loop in run17-session.)
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

    mask = n_mask[:, None] & m_mask[None, :]
    if SPLIT_K == 1:
        tl.store(out + offs_m[None, :] * stride_o_m + offs_n[:, None] * stride_o_n, result.to(out.dtype.element_ty),
                 mask=mask)
    else:
        tl.store(partials + (pid_k * M + offs_m[None, :]) * N + offs_n[:, None], result, mask=mask)


@triton.jit
def _sum_split_k_kernel(partials, out, numel, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """out (contiguous [M, N]) = the sum of the first SPLIT_K [M, N] slices of partials, cast to out's dtype."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = tl.load(partials + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(partials + s * numel + offs, mask=mask, other=0.0)
    tl.store(out + offs, acc.to(out.dtype.element_ty), mask=mask)


def _sum_split_k(args: dict, exception: BaseException | None = None) -> None:
    """The second pass of a split-K launch; nothing to do when SPLIT_K == 1.

    Also the autotuner's post_hook (``args``: the kernel's arguments by name, the config's included), which runs
    inside each benchmarked call, so split configs are timed with their reduction.
    """
    if exception is not None or args["SPLIT_K"] == 1:
        return
    numel = args["M"] * args["N"]
    _sum_split_k_kernel[(triton.cdiv(numel, SUM_BLOCK),)](
        args["partials"], args["out"], numel, SPLIT_K=args["SPLIT_K"], BLOCK=SUM_BLOCK, num_warps=4
    )


def _config(block_n: int, block_k: int, split_k: int, num_warps: int, num_stages: int) -> triton.Config:
    return triton.Config(
        {"BLOCK_N": block_n, "BLOCK_K": block_k, "SPLIT_K": split_k}, num_warps=num_warps, num_stages=num_stages
    )


# M == 1 (the GEMV path): configs by rule, not by the autotuner. A batch-1 step is a chain of dependent PDL launches,
# where a config's worth depends on what it overlaps; the autotuner times each call alone (the L2 flushed, nothing
# before it) and ranked them wrongly: in run 23 (bench/results/h200-2026-11-30/run23-baseline) it picked 16 x 256 for
# the [1024, 2048] out_proj, which takes 7.95 µs a call in a chain against 2.34 for 2 x 2048 (run 14's sweep), and the
# step's GPU time went from 0.824 to 0.953 ms. The
# rule comes from bench/gemv_chain.py: the model's 97 matmuls in model order, with their prologues, timed in one CUDA
# graph, each role's candidates tried with the others fixed (bench/results/h200-2026-11-30/run24-gemv-rule: the rule
# then took 535.9 µs a step, the descent's best 523.9; of that gap only down's 4 x 2048 was beyond the run's ~3 µs
# noise, in both passes, and is taken here; the wide roles' alternatives were within it).
GEMV_NARROW_N = 2048  # outputs up to this wide: latency-bound (4-8 MB), many programs loading K in 2,048-wide rows
GEMV_NARROW = _config(2, 2048, 1, 8, 1)  # out_proj, o_proj [1024, 2048]: whole rows in one load, 512 programs
GEMV_NARROW_LONG_K = _config(4, 2048, 1, 8, 1)  # K > 2048, down [1024, 3584]: two loads, 256 programs (-12 µs a step)
GEMV_WIDE = _config(8, 256, 1, 4, 4)  # in_proj, gate_up, qkv [5120..8224, 1024]; lm_head


def gemv_config(n: int, k: int) -> triton.Config:
    """The GEMV path's config for a [n, k] weight (see ``GEMV_NARROW_N``)."""
    if n <= GEMV_NARROW_N:
        return GEMV_NARROW if k <= 2048 else GEMV_NARROW_LONG_K
    return GEMV_WIDE


# Every config gemv_config may return, and a few more (the tests run them all; bench/ops_microbench.py sweeps them).
GEMV_CONFIGS = [GEMV_NARROW, GEMV_NARROW_LONG_K, GEMV_WIDE, _config(4, 1024, 1, 8, 2), _config(4, 512, 1, 4, 3),
                _config(32, 256, 1, 8, 3)]
# M = 2..16: autotuned. Few configs: each one costs a compile and a benchmark per (N, K) at start-up. Column-block
# counts are for the Qwen3.5-0.8B shapes: N = 1024 (out_proj, down_proj, o_proj), 5120..8224 (qkv, gate_up, in_proj),
# 248320 (lm_head).
DOT_CONFIGS = [  # M = 2..16
    _config(16, 256, 1, 4, 4),  # N = 1024: 64 programs
    _config(32, 256, 1, 4, 3),
    _config(64, 128, 1, 4, 4),  # BLOCK_N = 64: wgmma-sized weight tile
    _config(128, 128, 1, 8, 3),  # lm_head
    _config(16, 256, 4, 4, 3),  # N = 1024: 64 column blocks x 4 splits
    _config(64, 128, 2, 4, 4),  # N = 5120..8224: 80..129 column blocks x 2
]
MAX_SPLIT_K = max(c.kwargs["SPLIT_K"] for c in GEMV_CONFIGS + DOT_CONFIGS)  # sizes the partials buffer


def _prune(configs: list, named_args: dict, **kwargs) -> list:
    """Split configs only where a partials buffer was passed and K has a BLOCK_K chunk for every split."""

    def usable(c: triton.Config) -> bool:
        split, block_k = c.kwargs["SPLIT_K"], c.kwargs["BLOCK_K"]
        return split == 1 or (named_args["partials"] is not None and split <= triton.cdiv(named_args["K"], block_k))

    return [c for c in configs if usable(c)]


# Tuning results kept in Triton's cache directory, keyed by the kernel's source, the configs and the key values: a
# warm start-up skips the ~7 keys x 6 configs of benchmarks, which every process otherwise reruns (run 4 on the H200:
# decode start-up 16.5 s in a process that found the compile caches warm, against 11.7 s warm in run 1 before this
# kernel). Triton has the option from 3.4 on (FLA passes it from the same version).
_CACHE_RESULTS = {"cache_results": True} if "cache_results" in inspect.signature(triton.autotune).parameters else {}


# The 2..16-row path's autotuner (the one-row path uses gemv_config).
_DOT_TUNER = triton.autotune(
    configs=DOT_CONFIGS,
    key=["N", "K", "GATED_X", "NORM_X"],
    prune_configs_by={"early_config_prune": _prune},
    post_hook=_sum_split_k,
    # Shorter than the default (25 ms warm-up, 100 ms timed) per config: start-up tunes ~7 keys x 6 configs, and a
    # call takes 1..150 µs, so 20 ms is still hundreds of timed runs.
    do_bench=functools.partial(triton.testing.do_bench, warmup=5, rep=20),
    **_CACHE_RESULTS,
)(_skinny_gemm_kernel)


def block_rows(rows: int) -> int:
    """BLOCK_M for ``rows`` rows of x: 1 (CUDA-core GEMV) or DOT_ROWS (tensor cores)."""
    return 1 if rows == 1 else DOT_ROWS


def dot_autotuner():
    """The 2..16-row path's autotuner; its ``cache`` maps each tuned key to its pick."""
    return _DOT_TUNER


def skinny_gemm(
    x: torch.Tensor,  # [M, K] (gated: [M, 2K]), 1 <= M <= DOT_ROWS
    weight: torch.Tensor,  # [N, K], same dtype as x
    config: triton.Config | None = None,
    block_m: int | None = None,
    gated: bool = False,
) -> torch.Tensor:
    """``x @ weight.T`` -> [M, N] in x's dtype, fp32 accumulation; ``gated``: ``silu_mul(x) @ weight.T``.

    ``config`` (and ``block_m``, which defaults to :func:`block_rows`) run one fixed configuration without tuning:
    the interpreter tests (which cannot benchmark) and the microbenchmark's sweep use them; the op passes neither.
    """
    if gated and x.shape[1] % 2:
        raise ValueError(f"a gated skinny_gemm takes x = [gate | up] with an even width, got {x.shape[1]}")
    return _launch(x, weight, config, block_m, gated=gated)


def add_rms_norm_skinny_gemm(
    x: torch.Tensor,  # [M, K], 1 <= M <= DOT_ROWS
    residual: torch.Tensor,  # [M, K], unit stride along K
    norm_weight: torch.Tensor,  # [K]
    eps: float,
    weight: torch.Tensor,  # [N, K]
    config: triton.Config | None = None,
    block_m: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(residual + x) @ weight.T, residual + x)``: a decoder layer's residual add and norm in the
    prologue of the matmul after them (``ce::add_rms_norm_linear``). Every program recomputes the rows' statistics
    from x and residual (a few KB read from L2 per program) instead of waiting for a separate norm kernel."""
    rows, k = x.shape
    if residual.shape != x.shape or residual.stride(1) != 1 or norm_weight.shape != (k,):
        raise ValueError(f"add_rms_norm_skinny_gemm: residual must be [M, K] = {tuple(x.shape)} with unit stride "
                         f"along K and norm_weight [K]; got {tuple(residual.shape)}, {tuple(norm_weight.shape)}")
    summed = x.new_empty((rows, k))
    out = _launch(x, weight, config, block_m, norm=(residual, norm_weight.contiguous(), eps, summed))
    return out, summed


def _launch(x, weight, config, block_m, gated: bool = False, norm: tuple | None = None) -> torch.Tensor:
    rows, k = x.shape
    k = k // 2 if gated else k
    n = weight.shape[0]
    block_m = block_rows(rows) if block_m is None else block_m
    if rows > block_m:
        raise ValueError(f"skinny_gemm with BLOCK_M = {block_m} takes at most {block_m} rows, got {rows}")
    out = x.new_empty((rows, n))
    if config is None and block_m == 1:
        config = gemv_config(n, k)
    if config is None:  # room for whichever config the tuner picks
        splits = MAX_SPLIT_K if n <= SPLIT_K_MAX_N else 1
    else:
        splits = config.kwargs["SPLIT_K"]
    partials = x.new_empty((splits, rows, n), dtype=torch.float32) if splits > 1 else None
    residual, norm_weight, eps, summed = norm if norm is not None else (x, x, 0.0, x)  # unused placeholders
    args = (x, weight, out, partials, rows, n, k, *x.stride(), *weight.stride(), *out.stride(),
            residual, norm_weight, summed, residual.stride(0), eps)
    flags = {"BLOCK_M": block_m, "GATED_X": gated, "NORM_X": norm is not None,
             "NORM_BLOCK": min(triton.next_power_of_2(k), NORM_BLOCK_MAX), **pdl_flags(x)}
    if config is None:
        # Every tuned config has at least N / 128 programs: the prefetch's share is sized for that many.
        flags.update(l2_prefetch_flags(weight, triton.cdiv(n, max(c.kwargs["BLOCK_N"] for c in DOT_CONFIGS))))
        _DOT_TUNER[lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"])](*args, **flags)
        config = _DOT_TUNER.best_config
    else:
        grid = (triton.cdiv(n, config.kwargs["BLOCK_N"]), config.kwargs["SPLIT_K"])
        flags.update(l2_prefetch_flags(weight, grid[0] * grid[1]))
        _skinny_gemm_kernel[grid](*args, **flags, **config.all_kwargs())
    _sum_split_k({"partials": partials, "out": out, "M": rows, "N": n, "SPLIT_K": config.kwargs["SPLIT_K"]})
    return out
