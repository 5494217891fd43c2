"""Triton kernels for ``ce::fused_moe`` (the routed experts of a sparse MoE layer), ``ce::moe_route`` (the router's
softmax and top-k, one program per token) and ``ce::routed_moe`` (both).

Two paths, by the number of tokens T (routed rows ``r = t * k + j``, token t's j-th expert):

* up to ``MOE_GEMV_MAX_TOKENS`` tokens (decode at small batches), two GEMVs that read each row's expert straight
  from the routing ids, with no sort:
  1. ``_moe_gemv_gate_up_kernel``: program (r, n) computes ``act[r] = silu(x[t] @ gate[e].T) * (x[t] @ up[e].T)``
     for BLOCK_N columns;
  2. ``_moe_gemv_down_kernel``: program (t, n) streams token t's k experts' down rows together and writes the
     weighted sum of their outputs, rounded once (the down GEMV and the per-token sum in one launch).
* above, grouped GEMMs over the rows sorted by expert into blocks of BLOCK_M rows of one expert each
  (``ops.layouts.moe_align_block_size``; padding slots hold the sentinel ``T * k``): by ``_moe_align_kernel`` in one
  launch up to ``ALIGN_KERNEL_MAX_ROWS`` rows, above by the torch version. Each program of a grouped GEMM takes one
  block and BLOCK_N output columns, so it reads only its expert's weight tile, and every expert that no row chose
  costs nothing (vLLM's fused_moe kernel is the model of this layout; the code here is our own):
  1. ``_moe_gate_up_kernel``: ``act[r] = silu(x[t] @ gate[e].T) * (x[t] @ up[e].T)``. The program holds a gate and
     an up accumulator for the same BLOCK_N columns (gate rows n, up rows I + n of the fused ``[E, 2I, H]`` weight),
     so the activation is applied before anything is written: one ``[T*k, I]`` intermediate, not ``[T*k, 2I]``.
  2. ``_moe_down_kernel``: ``out[r] = weight[r] * (act[r] @ down[e].T)`` in fp32, ``[T*k, H]``.
  3. ``_moe_sum_kernel``: the k rows of a token are summed in fp32, in order (no atomics, so the result is
     deterministic), and rounded once to the model's dtype.

Grouped-GEMM programs whose block lies past ``num_padded`` (a device scalar: the grid is sized by the static bound,
so decode needs no host sync) return at once. Both paths round where the CPU reference rounds: gate and up to the
model's dtype before the activation, the activation before it meets up, their product before the down GEMM. fp32
inputs multiply in full fp32 (no TF32), as the reference does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.layouts import moe_align_block_size, moe_padded_rows
from ops.triton.gemv_kernels import VEC, fma_runs  # VEC: a thread's contiguous run along K (one 16-byte load)


@triton.jit
def _moe_gate_up_kernel(
    x, w, act, sorted_rows, block_experts, num_padded,
    num_rows, inter, hidden,
    stride_x, stride_we, stride_wn, stride_act,
    TOP_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PRECISION: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_padded):
        return
    rows = tl.load(sorted_rows + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    live = rows < num_rows
    tokens = (rows // TOP_K).to(tl.int64)
    expert = tl.load(block_experts + pid_m).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inter
    ks = tl.arange(0, BLOCK_K)
    x_ptrs = x + tokens[:, None] * stride_x + ks[None, :]
    gate_ptrs = w + expert * stride_we + cols.to(tl.int64)[None, :] * stride_wn + ks[:, None]
    up_ptrs = gate_ptrs + inter * stride_wn
    acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        k_ok = ks < hidden - k0
        a = tl.load(x_ptrs, mask=live[:, None] & k_ok[None, :], other=0.0)
        b_mask = k_ok[:, None] & col_ok[None, :]
        acc_gate = tl.dot(a, tl.load(gate_ptrs, mask=b_mask, other=0.0), acc_gate, input_precision=PRECISION)
        acc_up = tl.dot(a, tl.load(up_ptrs, mask=b_mask, other=0.0), acc_up, input_precision=PRECISION)
        x_ptrs += BLOCK_K
        gate_ptrs += BLOCK_K
        up_ptrs += BLOCK_K
    dtype = act.dtype.element_ty
    gate = acc_gate.to(dtype).to(tl.float32)
    up = acc_up.to(dtype).to(tl.float32)
    activated = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32)
    out_ptrs = act + rows.to(tl.int64)[:, None] * stride_act + cols[None, :]
    tl.store(out_ptrs, (activated * up).to(dtype), mask=live[:, None] & col_ok[None, :])


@triton.jit
def _moe_down_kernel(
    act, w, out, weights, sorted_rows, block_experts, num_padded,
    num_rows, hidden, inter,
    stride_act, stride_we, stride_wn, stride_out,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    if pid_m * BLOCK_M >= tl.load(num_padded):
        return
    rows = tl.load(sorted_rows + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    live = rows < num_rows
    rows64 = rows.to(tl.int64)
    expert = tl.load(block_experts + pid_m).to(tl.int64)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = act + rows64[:, None] * stride_act + ks[None, :]
    b_ptrs = w + expert * stride_we + cols.to(tl.int64)[None, :] * stride_wn + ks[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        k_ok = ks < inter - k0
        a = tl.load(a_ptrs, mask=live[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    scale = tl.load(weights + rows64, mask=live, other=0.0)
    out_ptrs = out + rows64[:, None] * stride_out + cols[None, :]
    tl.store(out_ptrs, acc * scale[:, None], mask=live[:, None] & col_ok[None, :])


@triton.jit
def _moe_gemv_gate_up_kernel(
    x, w, act, ids, inter, hidden, stride_x, stride_we, stride_wn, stride_act,
    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """The few-tokens path's ``act[r] = silu(x[t] @ gate[e].T) * (x[t] @ up[e].T)``: program (r, n) reads routed row
    r's expert straight from ``ids`` (no sort) and streams BLOCK_N gate rows and the same up rows along H as a GEMV.
    Each iteration issues the next chunk's loads before it multiplies the current one in program order (a chunk past
    the end is fully masked: no traffic), so that a program's chunks can be in flight together rather than one memory
    round trip each (ptxas may still sink the loads below the math at some tiles: bench/moe_microbench.py picks); the
    products are summed over each thread's VEC contiguous K values as they come, one FMA each (``fma_runs``:
    accumulators BLOCK_N x BLOCK_K / VEC), and across threads once after the loop."""
    row = tl.program_id(0)
    token = (row // TOP_K).to(tl.int64)
    expert = tl.load(ids + row).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < inter
    ks = tl.arange(0, BLOCK_K)
    x_row = x + token * stride_x
    gate_rows = w + expert * stride_we + cols.to(tl.int64)[:, None] * stride_wn
    up_rows = gate_rows + inter * stride_wn
    k_ok = ks < hidden
    xv = tl.load(x_row + ks, mask=k_ok, other=0.0)
    gate_w = tl.load(gate_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
    up_w = tl.load(up_rows + ks[None, :], mask=col_ok[:, None] & k_ok[None, :], other=0.0)
    acc_gate = tl.zeros((1, BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
    acc_up = tl.zeros((1, BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
    for k0 in range(BLOCK_K, hidden + BLOCK_K, BLOCK_K):
        next_ks = k0 + ks
        next_ok = next_ks < hidden
        next_x = tl.load(x_row + next_ks, mask=next_ok, other=0.0)
        next_gate = tl.load(gate_rows + next_ks[None, :], mask=col_ok[:, None] & next_ok[None, :], other=0.0)
        next_up = tl.load(up_rows + next_ks[None, :], mask=col_ok[:, None] & next_ok[None, :], other=0.0)
        acc_gate = fma_runs(acc_gate, gate_w, xv, 1, BLOCK_N, 1, 1, BLOCK_K // VEC)
        acc_up = fma_runs(acc_up, up_w, xv, 1, BLOCK_N, 1, 1, BLOCK_K // VEC)
        xv, gate_w, up_w = next_x, next_gate, next_up
    dtype = act.dtype.element_ty
    gate = tl.reshape(tl.sum(acc_gate, axis=2), [BLOCK_N]).to(dtype).to(tl.float32)
    up = tl.reshape(tl.sum(acc_up, axis=2), [BLOCK_N]).to(dtype).to(tl.float32)
    activated = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32)
    tl.store(act + row.to(tl.int64) * stride_act + cols, (activated * up).to(dtype), mask=col_ok)


@triton.jit
def _moe_gemv_down_kernel(
    act, w, out, weights, ids, hidden, inter, stride_act, stride_we, stride_wn, stride_out,
    TOP_K: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """The few-tokens path's ``out[t] = sum_j weight[t, j] * (act[t * k + j] @ down[e_j].T)``: program (t, n) loads
    token t's k expert ids at once and streams the k experts' BLOCK_N down rows together (a [BLOCK_J, BLOCK_N,
    BLOCK_K] tile: no chain of k dependent loads; the next chunk's loads issued before the current one is multiplied,
    as in the gate_up kernel), sums the k weighted outputs in fp32 and rounds once: the down GEMV and the per-token
    sum in one launch."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < hidden
    js = tl.arange(0, BLOCK_J)
    j_ok = js < TOP_K
    rows = token * TOP_K + js
    experts = tl.load(ids + rows, mask=j_ok, other=0).to(tl.int64)
    ks = tl.arange(0, BLOCK_K)
    w_rows = w + experts[:, None, None] * stride_we + cols.to(tl.int64)[None, :, None] * stride_wn
    a_rows = act + rows[:, None] * stride_act
    live = j_ok[:, None, None] & col_ok[None, :, None]
    k_ok = ks < inter
    a = tl.load(a_rows + ks[None, :], mask=j_ok[:, None] & k_ok[None, :], other=0.0)
    b = tl.load(w_rows + ks[None, None, :], mask=live & k_ok[None, None, :], other=0.0)
    acc = tl.zeros((BLOCK_J, BLOCK_N, BLOCK_K // VEC), dtype=tl.float32)
    for k0 in range(BLOCK_K, inter + BLOCK_K, BLOCK_K):
        next_ks = k0 + ks
        next_ok = next_ks < inter
        next_a = tl.load(a_rows + next_ks[None, :], mask=j_ok[:, None] & next_ok[None, :], other=0.0)
        next_b = tl.load(w_rows + next_ks[None, None, :], mask=live & next_ok[None, None, :], other=0.0)
        acc = fma_runs(acc, b, a, BLOCK_J, BLOCK_N, BLOCK_J, 1, BLOCK_K // VEC)
        a, b = next_a, next_b
    scale = tl.load(weights + rows, mask=j_ok, other=0.0)
    total = tl.sum(tl.sum(acc, axis=2) * scale[:, None], axis=0)
    tl.store(out + token * stride_out + cols, total.to(out.dtype.element_ty), mask=col_ok)


@triton.jit
def _moe_route_kernel(logits, weights, ids, num_experts, stride_row, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr,
                      BLOCK_K: tl.constexpr, RENORMALIZE: tl.constexpr):
    """``ce::moe_route``, one program per token (one launch instead of torch's five): softmax over the experts in
    fp32, k passes of (max, first index of the max, knock it out), the k weights divided by their sum when
    RENORMALIZE."""
    row = tl.program_id(0).to(tl.int64)
    experts = tl.arange(0, BLOCK_E)
    real = experts < num_experts
    x = tl.load(logits + row * stride_row + experts, mask=real, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    p = tl.where(real, p / tl.sum(p, axis=0), -1.0)  # padding lanes never win
    slots = tl.arange(0, BLOCK_K)
    values = tl.zeros((BLOCK_K,), dtype=tl.float32)
    chosen = tl.zeros((BLOCK_K,), dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(p, axis=0)
        at = tl.argmax(p, axis=0, tie_break_left=True)
        values = tl.where(slots == j, best, values)
        chosen = tl.where(slots == j, at, chosen)
        p = tl.where(experts == at, -1.0, p)
    if RENORMALIZE:
        values = values / tl.sum(values, axis=0)  # the unused slots hold 0
    tl.store(weights + row * TOP_K + slots, values, mask=slots < TOP_K)
    tl.store(ids + row * TOP_K + slots, chosen, mask=slots < TOP_K)


def moe_route(router_logits: torch.Tensor, top_k: int, renormalize: bool):
    """``ce::moe_route``'s kernel: one program per token (columns must be contiguous; rows may be strided)."""
    tokens, num_experts = router_logits.shape
    if router_logits.stride(1) != 1:
        router_logits = router_logits.contiguous()
    weights = torch.empty((tokens, top_k), dtype=torch.float32, device=router_logits.device)
    ids = torch.empty((tokens, top_k), dtype=torch.int32, device=router_logits.device)
    if tokens:
        _moe_route_kernel[(tokens,)](
            router_logits, weights, ids, num_experts, router_logits.stride(0), TOP_K=top_k,
            BLOCK_E=triton.next_power_of_2(num_experts), BLOCK_K=triton.next_power_of_2(top_k),
            RENORMALIZE=renormalize, num_warps=4 if num_experts > 256 else 1,
        )
    return weights, ids


@triton.jit
def _moe_align_kernel(
    ids, sorted_rows, block_experts, num_padded, num_rows, num_experts, length, num_blocks,
    BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, CHUNK: tl.constexpr,
):
    """``ops.layouts.moe_align_block_size`` in one program (one launch instead of about ten torch kernels, for the
    few rows of a decode step): count each expert's rows, place the padded segments,
    write the sentinel, each block's expert, then each row at its expert's segment start + its rank among the
    expert's earlier rows."""
    experts = tl.arange(0, BLOCK_E)
    counts = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for start in range(0, num_rows, CHUNK):
        rows = start + tl.arange(0, CHUNK)
        e = tl.load(ids + rows, mask=rows < num_rows, other=-1)
        counts += tl.sum((e[:, None] == experts[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    starts = ends - padded
    tl.store(num_padded, tl.sum(padded, axis=0))
    for start in range(0, length, CHUNK):
        slots = start + tl.arange(0, CHUNK)
        tl.store(sorted_rows + slots, tl.full((CHUNK,), 0, tl.int32) + num_rows, mask=slots < length)
    real = experts < num_experts
    for start in range(0, num_blocks, CHUNK):
        blocks = start + tl.arange(0, CHUNK)
        before = tl.sum(((ends[None, :] <= (blocks * BLOCK_M)[:, None]) & real[None, :]).to(tl.int32), axis=1)
        tl.store(block_experts + blocks, tl.minimum(before, num_experts - 1), mask=blocks < num_blocks)
    tl.debug_barrier()  # the sentinel fill above is done (by every thread) before rows overwrite it
    taken = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for start in range(0, num_rows, CHUNK):
        rows = start + tl.arange(0, CHUNK)
        e = tl.load(ids + rows, mask=rows < num_rows, other=-1)
        onehot = (e[:, None] == experts[None, :]).to(tl.int32)
        earlier = tl.cumsum(onehot, axis=0) - onehot  # this chunk's earlier rows of the same expert
        position = tl.sum(onehot * (earlier + (starts + taken)[None, :]), axis=1)
        tl.store(sorted_rows + position, rows, mask=rows < num_rows)
        taken += tl.sum(onehot, axis=0)


# Up to this many routed rows (T x k) the one-program align kernel runs; above, the torch version (a sort).
ALIGN_KERNEL_MAX_ROWS = 1024
ALIGN_KERNEL_MAX_EXPERTS = 512


def _align_outputs(num_rows: int, num_experts: int, block_m: int, device):
    """The align's outputs, empty: ``sorted_rows [moe_padded_rows]``, ``block_experts``, ``num_padded [1]``."""
    length = moe_padded_rows(num_rows, num_experts, block_m)
    return (torch.empty(length, dtype=torch.int32, device=device),
            torch.empty(length // block_m, dtype=torch.int32, device=device),
            torch.empty(1, dtype=torch.int32, device=device))


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int):
    """``ops.layouts.moe_align_block_size``'s result: by the one-program kernel for a decode step's few rows, by
    the torch version (a stable sort) above ``ALIGN_KERNEL_MAX_ROWS``."""
    num_rows = topk_ids.numel()
    if num_rows > ALIGN_KERNEL_MAX_ROWS or num_experts > ALIGN_KERNEL_MAX_EXPERTS:
        return moe_align_block_size(topk_ids, num_experts, block_m)
    sorted_rows, block_experts, num_padded = _align_outputs(num_rows, num_experts, block_m, topk_ids.device)
    length = sorted_rows.shape[0]
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()  # read with unit stride
    _moe_align_kernel[(1,)](
        ids, sorted_rows, block_experts, num_padded, num_rows, num_experts, length, length // block_m,
        BLOCK_M=block_m, BLOCK_E=triton.next_power_of_2(num_experts), CHUNK=32, num_warps=4,
    )
    return sorted_rows, block_experts, num_padded


@triton.jit
def _moe_sum_kernel(routed, out, hidden, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    """``out[t] = sum_j routed[t * k + j]`` in fp32 (j in order), rounded once to out's dtype."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < hidden
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(routed + (token * TOP_K + j) * hidden + cols, mask=mask, other=0.0)
    tl.store(out + token * hidden + cols, acc.to(out.dtype.element_ty), mask=mask)


def moe_config(num_rows: int, num_experts: int) -> dict:
    """Tile sizes by rule: BLOCK_M 16 while an expert gets few rows on average (decode: T x k rows over E experts),
    64 once blocks fill (prefill); narrow N tiles at few rows, so that the few blocks still spread over the SMs."""
    per_expert = num_rows / num_experts
    if per_expert <= 16:
        return dict(block_m=16, block_n=32 if num_rows <= 64 else 64, block_k=128, num_warps=4)
    return dict(block_m=64, block_n=64, block_k=64, num_warps=4)


# Up to this many tokens the experts run as GEMVs (``_moe_gemv_*``: no align, no sum kernel), above as grouped GEMMs
# (on the 35B-A3B shape the GEMVs are faster at 1-16 tokens: bench/NOTES.md, "Runs 67-").
MOE_GEMV_MAX_TOKENS = 16


def moe_gemv_config(hidden: int, inter: int) -> dict:
    """The few-tokens path's tiles: BLOCK_N output columns a program (gate_up: of the gate and of the up half; down:
    of each of the token's k experts), along K in BLOCK_K chunks; at batch 1 on the 35B-A3B shape 8 x 128 gate_up and
    1 x 1024 down programs."""
    def chunk(k: int, most: int) -> int:  # a power of two, at least one thread's VEC run
        return max(VEC.value, min(most, triton.next_power_of_2(k)))

    return dict(gate_up=dict(block_n=4, block_k=chunk(hidden, 1024), num_warps=4),
                down=dict(block_n=2, block_k=chunk(inter, 256), num_warps=4))


def experts_gemv(x, gate_up, down, topk_weights, topk_ids, config=None):
    """The routed experts of a few tokens: one gate_up GEMV program per (routed row, column block), reading its expert
    from ``topk_ids``, then one down GEMV per (token, column block) summing the token's k experts."""
    tokens, hidden = x.shape
    top_k = topk_ids.shape[1]
    inter = gate_up.shape[1] // 2
    config = config or moe_gemv_config(hidden, inter)
    if any(tiles["block_k"] % VEC.value for tiles in config.values()):
        raise ValueError(f"experts_gemv takes BLOCK_K in multiples of {VEC.value}, got {config}")
    ids = topk_ids.reshape(-1).to(torch.int32).contiguous()
    weights = topk_weights.reshape(-1).float().contiguous()
    act = torch.empty((tokens * top_k, inter), dtype=x.dtype, device=x.device)
    gu = config["gate_up"]
    _moe_gemv_gate_up_kernel[(tokens * top_k, triton.cdiv(inter, gu["block_n"]))](
        x, gate_up, act, ids, inter, hidden, x.stride(0), gate_up.stride(0), gate_up.stride(1), act.stride(0),
        TOP_K=top_k, BLOCK_N=gu["block_n"], BLOCK_K=gu["block_k"], num_warps=gu["num_warps"],
    )
    dn = config["down"]
    out = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
    _moe_gemv_down_kernel[(tokens, triton.cdiv(hidden, dn["block_n"]))](
        act, down, out, weights, ids, hidden, inter, act.stride(0), down.stride(0), down.stride(1), out.stride(0),
        TOP_K=top_k, BLOCK_J=triton.next_power_of_2(top_k), BLOCK_N=dn["block_n"], BLOCK_K=dn["block_k"],
        num_warps=dn["num_warps"],
    )
    return out


def fused_moe(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    block_m: int | None = None,
    block_n: int | None = None,
    block_k: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """``ce::fused_moe``'s kernels: up to ``MOE_GEMV_MAX_TOKENS`` tokens the GEMVs (``experts_gemv``, tiles by
    ``moe_gemv_config``), above them the align and the grouped GEMMs, tiles by ``moe_config``'s rule. Tiles given here
    (the tests' and the microbench's) run the grouped GEMMs at any token count."""
    tokens = x.shape[0]
    if tokens == 0:
        return torch.empty_like(x)
    if x.stride(1) != 1:
        x = x.contiguous()
    tiles = (block_m, block_n, block_k, num_warps)
    if tokens <= MOE_GEMV_MAX_TOKENS and all(t is None for t in tiles):
        return experts_gemv(x, gate_up.contiguous(), down.contiguous(), topk_weights, topk_ids)
    top_k = topk_ids.shape[1]
    config = moe_config(tokens * top_k, gate_up.shape[0])
    for key, value in zip(("block_m", "block_n", "block_k", "num_warps"), tiles):
        if value is not None:
            config[key] = value
    sorted_rows, block_experts, num_padded = moe_align(topk_ids, gate_up.shape[0], config["block_m"])
    return _experts(x, gate_up.contiguous(), down.contiguous(), topk_weights, top_k, sorted_rows, block_experts,
                    num_padded, config)


def routed_moe(x: torch.Tensor, router_logits: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, top_k: int,
               renormalize: bool) -> torch.Tensor:
    """``ce::routed_moe``'s kernels: the route (``moe_route``, one launch), then ``fused_moe`` (the GEMVs up to
    ``MOE_GEMV_MAX_TOKENS`` tokens, the align and the grouped GEMMs above)."""
    weights, ids = moe_route(router_logits, top_k, renormalize)
    return fused_moe(x, gate_up, down, weights, ids)


def _experts(x, gate_up, down, topk_weights, top_k, sorted_rows, block_experts, num_padded, config):
    """The grouped GEMMs and the per-token sum over expert-sorted rows (``fused_moe``'s second half)."""
    tokens, hidden = x.shape
    inter = gate_up.shape[1] // 2
    num_rows = tokens * top_k
    bm, bn, bk, warps = config["block_m"], config["block_n"], config["block_k"], config["num_warps"]
    out = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
    num_blocks = block_experts.shape[0]
    precision = "ieee" if x.dtype == torch.float32 else "tf32"  # fp32 models (the exactness tests): no TF32
    act = torch.empty((num_rows, inter), dtype=x.dtype, device=x.device)
    _moe_gate_up_kernel[(num_blocks, triton.cdiv(inter, bn))](
        x, gate_up, act, sorted_rows, block_experts, num_padded,
        num_rows, inter, hidden,
        x.stride(0), gate_up.stride(0), gate_up.stride(1), act.stride(0),
        TOP_K=top_k, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PRECISION=precision, num_warps=warps,
    )
    routed = torch.empty((num_rows, hidden), dtype=torch.float32, device=x.device)
    _moe_down_kernel[(num_blocks, triton.cdiv(hidden, bn))](
        act, down, routed, topk_weights.reshape(-1).float().contiguous(), sorted_rows, block_experts, num_padded,
        num_rows, hidden, inter,
        act.stride(0), down.stride(0), down.stride(1), routed.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PRECISION=precision, num_warps=warps,
    )
    block = min(1024, triton.next_power_of_2(hidden))
    _moe_sum_kernel[(tokens, triton.cdiv(hidden, block))](routed, out, hidden, TOP_K=top_k, BLOCK=block, num_warps=4)
    return out
