"""Triton kernel for ``ce::silu_mul``: ``out[t, j] = silu(gate_up[t, j]) * gate_up[t, I + j]``, one pass.

Grid (rows, column blocks); each program reads BLOCK columns of the gate and of the up half of one row and writes
them once. The silu is computed in fp32 and rounded to the output dtype before the multiply, as the reference
(``F.silu`` on a bf16 tensor, then a bf16 multiply) rounds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

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
def _silu_mul_kernel(gate_up, out, half, stride_row, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < half
    gate = tl.load(gate_up + row * stride_row + cols, mask=mask, other=0.0)
    up = tl.load(gate_up + row * stride_row + half + cols, mask=mask, other=0.0)
    tl.store(out + row * half + cols, silu_mul_values(gate, up, out.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    rows, width = gate_up.shape
    if width % 2:
        raise ValueError(f"silu_mul needs an even number of columns (gate | up), got {width}")
    if gate_up.stride(1) != 1:
        gate_up = gate_up.contiguous()
    half = width // 2
    out = torch.empty((rows, half), dtype=gate_up.dtype, device=gate_up.device)
    if rows == 0 or half == 0:
        return out
    _silu_mul_kernel[(rows, triton.cdiv(half, BLOCK))](gate_up, out, half, gate_up.stride(0), BLOCK=BLOCK, num_warps=4)
    return out
