"""Triton kernel for ``ce::silu_mul``: ``out[t, j] = silu(gate_up[t, j]) * gate_up[t, I + j]``, one pass.

Grid (rows, column blocks); each program reads BLOCK columns of the gate and of the up half of one row and writes
them once. The silu is computed in fp32 and rounded to the output dtype before the multiply, as the reference
(``F.silu`` on a bf16 tensor, then a bf16 multiply) rounds. Where cuBLAS runs the down projection after it, the
kernel can bring that matmul's weight into L2 (``prefetch``: ops/triton/l2_prefetch.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.triton.l2_prefetch import prefetch_l2_slab, spread_prefetch

BLOCK = 1024


@triton.jit
def silu_mul_values(gate, up, dtype: tl.constexpr):
    """``silu(gate) * up`` in ``dtype`` from gate and up values in ``dtype``, rounded as ``ce::silu_mul`` rounds:
    silu's output in ``dtype``, then the product. Shared with the skinny GEMM's SiLU prologue and epilogue
    (ops/triton/gemv_kernels.py), so the fused ops round as this one does."""
    gate = gate.to(tl.float32)
    activated = (gate * tl.sigmoid(gate)).to(dtype)
    return (activated.to(tl.float32) * up.to(tl.float32)).to(dtype)


@triton.jit
def _silu_mul_kernel(gate_up, out, rows, half, stride_row, prefetch, prefetch_bytes, prefetch_programs,
                     BLOCK: tl.constexpr, PREFETCH_L2: tl.constexpr):
    if PREFETCH_L2:  # the next matmul's weight; rows past ``rows`` only prefetch (spread_prefetch)
        program = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        prefetch_l2_slab(prefetch, prefetch_bytes, program, prefetch_programs)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < half * (row < rows).to(tl.int32)  # a count, not block & scalar (the interpreter rejects that)
    gate = tl.load(gate_up + row * stride_row + cols, mask=mask, other=0.0)
    up = tl.load(gate_up + row * stride_row + half + cols, mask=mask, other=0.0)
    tl.store(out + row * half + cols, silu_mul_values(gate, up, out.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor, prefetch: torch.Tensor | None = None) -> torch.Tensor:
    """``prefetch``: a weight to bring into L2 while the kernel runs (the down projection's, where cuBLAS runs it); a
    hint, dropped where bulk prefetches cannot run or the weight does not suit (``l2_prefetch_flags``)."""
    rows, width = gate_up.shape
    if width % 2:
        raise ValueError(f"silu_mul needs an even number of columns (gate | up), got {width}")
    if gate_up.stride(1) != 1:
        gate_up = gate_up.contiguous()
    half = width // 2
    out = torch.empty((rows, half), dtype=gate_up.dtype, device=gate_up.device)
    if rows == 0 or half == 0:
        return out
    blocks = triton.cdiv(half, BLOCK)
    programs, prefetch_flags = spread_prefetch(prefetch, rows * blocks)
    prefetch = prefetch if prefetch_flags["PREFETCH_L2"] else out  # a placeholder pointer, never read
    _silu_mul_kernel[(triton.cdiv(programs, blocks), blocks)](
        gate_up, out, rows, half, gate_up.stride(0), prefetch, prefetch.numel() * prefetch.element_size(),
        BLOCK=BLOCK, num_warps=4, **prefetch_flags,
    )
    return out
