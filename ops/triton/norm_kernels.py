"""Triton kernels for ``ce::rms_norm`` and ``ce::add_rms_norm``: one pass per row, fp32 statistics, the reference's
rounding points.

``add_rms_norm`` is the decoder layers' residual add and the norm after it, one program per token row, launched with
PDL (ops/triton/pdl.py): in a batch-1 decode step it sits between two weight matmuls, and the matmul after it can
start loading its weights while it runs.

Rows are the ``T x H`` vectors of length D of ``x [T, H, D]``; row r is (t, h) = (r // H, r % H), so x and gate may be
strided views over T and H (a head's slice of a fused projection's output) without a copy. Each program normalises
BLOCK_R rows held whole in registers (D is at most a few thousand), so x is read once and the output written once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.triton import unit_stride
from ops.triton.pdl import pdl_flags

ELEMENTS_PER_PROGRAM = 4096  # BLOCK_R x padded D: 4 rows of 1,024, 16 rows of 256, 32 rows of 128


@triton.jit
def _rms_norm_kernel(
    x,
    gate,  # unused when GATED is False
    weight,
    out,  # contiguous [rows, D]
    rows,
    H,
    stride_x_t,
    stride_x_h,
    stride_g_t,
    stride_g_h,
    eps,
    D: tl.constexpr,
    D_P: tl.constexpr,
    BLOCK_R: tl.constexpr,
    GATED: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    d = tl.arange(0, D_P)
    d_mask = d < D
    mask = (r < rows)[:, None] & d_mask[None, :]
    t = r // H
    h = r % H
    xv = tl.load(x + (t * stride_x_t + h * stride_x_h)[:, None] + d[None, :], mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xv * xv, axis=1) / D + eps)
    normed = xv * rstd[:, None]
    w = tl.load(weight + d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
    dtype = out.dtype.element_ty
    if GATED:
        # Rounded where the reference rounds: normed and w * normed in x's dtype, the gate product in fp32.
        scaled = (w * normed.to(dtype).to(tl.float32)).to(dtype).to(tl.float32)
        g = tl.load(gate + (t * stride_g_t + h * stride_g_h)[:, None] + d[None, :], mask=mask, other=0.0)
        g = g.to(tl.float32)
        y = scaled * (g * tl.sigmoid(g))
    else:
        y = normed * (1.0 + w)
    tl.store(out + r[:, None] * D + d[None, :], y.to(dtype), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor | None, eps: float, zero_centred: bool
) -> torch.Tensor:
    if gate is not None and (zero_centred or gate.shape != x.shape):
        raise ValueError(f"rms_norm: a gate must match x's shape {tuple(x.shape)} and the norm must not be "
                         f"zero-centred (got gate {None if gate is None else tuple(gate.shape)}, {zero_centred=})")
    if gate is None and not zero_centred:
        raise ValueError("rms_norm without a gate is the zero-centred norm")
    tokens, heads, dim = x.shape
    if weight.shape != (dim,):
        raise ValueError(f"rms_norm: weight must be [{dim}], got {tuple(weight.shape)}")
    # Rows are addressed through the T and H strides; the D axis must be unit-stride (the model's views all are).
    x = x if x.stride(2) == 1 else x.contiguous()
    gate = gate if gate is None or gate.stride(2) == 1 else gate.contiguous()
    out = torch.empty((tokens, heads, dim), dtype=x.dtype, device=x.device)
    rows = tokens * heads
    if rows == 0:
        return out
    d_p = triton.next_power_of_2(dim)
    block_r = max(1, ELEMENTS_PER_PROGRAM // d_p)
    g = gate if gate is not None else x  # a placeholder pointer the GATED=False kernel never reads
    weight = unit_stride(weight)  # [D]
    _rms_norm_kernel[(triton.cdiv(rows, block_r),)](
        x, g, weight, out, rows, heads, x.stride(0), x.stride(1), g.stride(0), g.stride(1), eps,
        D=dim, D_P=d_p, BLOCK_R=block_r, GATED=gate is not None, num_warps=4 if d_p * block_r <= 4096 else 8,
    )
    return out


@triton.jit
def _add_rms_norm_kernel(
    x,
    residual,
    weight,
    summed,  # contiguous [rows, D]: residual + x
    out,  # contiguous [rows, D]: the zero-centred norm of summed
    stride_x,
    stride_r,
    eps,
    D: tl.constexpr,
    D_P: tl.constexpr,
    USE_PDL: tl.constexpr,  # ops/triton/pdl.py
):
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, D_P)
    d_mask = d < D
    w = tl.load(weight + d, mask=d_mask, other=0.0).to(tl.float32)  # a weight: no earlier kernel writes it
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
    dtype = summed.dtype.element_ty
    # The residual add rounds to the activations' dtype (as the model's plain `residual + x` does); the norm's
    # statistics are then taken from the rounded sum, in fp32.
    s = (tl.load(residual + row * stride_r + d, mask=d_mask, other=0.0).to(tl.float32)
         + tl.load(x + row * stride_x + d, mask=d_mask, other=0.0).to(tl.float32)).to(dtype)
    tl.store(summed + row * D + d, s, mask=d_mask)
    sf = s.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(sf * sf, axis=0) / D + eps)
    tl.store(out + row * D + d, (sf * rstd * (1.0 + w)).to(dtype), mask=d_mask)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() != 2 or residual.shape != x.shape or weight.shape != (x.shape[1],) or residual.dtype != x.dtype:
        raise ValueError(f"add_rms_norm: x and residual must be [T, D] of one dtype and weight [D]; got x "
                         f"{tuple(x.shape)} {x.dtype}, residual {tuple(residual.shape)} {residual.dtype}, "
                         f"weight {tuple(weight.shape)}")
    x = x if x.stride(1) == 1 else x.contiguous()
    residual = residual if residual.stride(1) == 1 else residual.contiguous()
    tokens, dim = x.shape
    summed = torch.empty((tokens, dim), dtype=x.dtype, device=x.device)
    out = torch.empty_like(summed)
    if tokens == 0:
        return summed, out
    d_p = triton.next_power_of_2(dim)
    weight = unit_stride(weight)  # [D]
    _add_rms_norm_kernel[(tokens,)](
        x, residual, weight, summed, out, x.stride(0), residual.stride(0), eps,
        D=dim, D_P=d_p, num_warps=4 if d_p <= 2048 else 8, **pdl_flags(x),
    )
    return summed, out
