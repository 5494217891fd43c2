"""``ce::linear``: ``x @ weight.T`` (no bias) for the model's weight matmuls, with a skinny-GEMM kernel for decode.

Why an op of our own rather than ``F.linear``: at decode batch sizes the weight matmuls are bound by reading the
weights, and cuBLAS picks poor kernels for a handful of rows on these small matrices (bench/NOTES.md, "Skinny
GEMM"). The CUDA kernel runs our Triton skinny GEMM (ops/triton/gemv_kernels.py: a one-row and a few-rows GEMV, and
for the vocabulary's matmul from 3 rows a tensor-core loop) up to ``SKINNY_MAX_ROWS`` = 5 rows (decode batches 1-4,
and speculative verify steps of up to 5 rows) and cuBLAS from 6 rows on. It decides at run time, inside the opaque
op, where M is a plain int: a compiled graph with a symbolic batch size never guards on it.

* ``ce::linear(x [M, K], weight [N, K]) -> [M, N]`` in x's dtype;
* ``ce::silu_mul_linear(gate_up [M, 2K], weight [N, K]) -> [M, N]``: ``silu_mul(gate_up) @ weight.T``, an MLP's
  activation and down projection where gate_up comes from a wider projection (a sparse MoE block's shared expert,
  whose gate_up shares its matmul with the router). Up to ``SKINNY_MAX_ROWS`` rows the skinny GEMM computes the
  activation as it loads x (one launch instead of two); above, ``ce::silu_mul`` then cuBLAS.
* ``ce::add_rms_norm_linear(x [M, K], residual [M, K], norm_weight [K], eps, weight [N, K]) -> (out [M, N],
  summed [M, K])``: a decoder layer's residual add (``summed = residual + x``), its zero-centred RMSNorm and the
  projection after it. At one row the skinny GEMM's programs compute the norm themselves (one launch instead of two:
  at batch 1, 47 fewer launches a step); from two rows ``ce::add_rms_norm`` comes first, then the skinny GEMM up to
  ``SKINNY_MAX_ROWS`` rows and cuBLAS above.
* ``ce::add_rms_norm_linear_silu_mul(x [M, K], residual [M, K], norm_weight [K], eps, weight [2I, K]) -> (out [M,
  I], summed [M, K])``: the same with the MLP's activation after the projection, ``silu_mul(normed @ weight.T)``
  (weight: the gate_up projection, ``[gate | up]`` rows). Up to ``SKINNY_MAX_ROWS`` rows the skinny GEMM's programs
  each own matching gate and up rows and write ``silu(gate) * up`` (no activation kernel, and the down projection
  after it reads I columns with no prologue); above, cuBLAS then ``ce::silu_mul``.
* :func:`linear`, :func:`silu_mul_linear`: the model's entry points, for x of any leading shape.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ops.activation import silu_mul_op, silu_mul_reference
from ops.library import define_op
from ops.norm import add_rms_norm_op, add_rms_norm_reference
from ops.options import current_options
from ops.triton import HAVE_TRITON

if HAVE_TRITON:  # else cuBLAS serves every matmul (ops/triton/__init__.py)
    from ops.triton import gemv_kernels

# Rows up to which the Triton skinny GEMM runs instead of cuBLAS: the decode buckets 1-4 and the 5 rows of a batch-1
# verify at k = 4 (as 4 + 1), where its GEMV paths read the weights faster than cuBLAS's kernels do. From 6 rows
# cuBLAS (with the norm and the activation as kernels of their own) was faster than every path of ours that was
# measured (bench/NOTES.md, "Skinny GEMM" and "Removed alternatives", has the figures). At most
# gemv_kernels.GEMV_MAX_ROWS, the most rows the kernel takes.
SKINNY_MAX_ROWS = 5
SKINNY_DTYPES = (torch.bfloat16, torch.float16)  # served models; fp32 ones (the exactness tests) keep cuBLAS


def linear_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(x, weight)


def _skinny(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the Triton skinny GEMM serves this call (else cuBLAS). The ``skinny_gemm`` option (ops/options.py,
    ``CE_SKINNY_GEMM=0``) sends every matmul to cuBLAS: to compare, or where the Triton kernel misbehaves on a new GPU
    or Triton version."""
    return (HAVE_TRITON and current_options().skinny_gemm and x.dim() == 2 and 1 <= x.shape[0] <= SKINNY_MAX_ROWS
            and x.dtype in SKINNY_DTYPES and weight.dtype == x.dtype)


def _linear_cuda(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if _skinny(x, weight):
        return gemv_kernels.skinny_gemm(x, weight)
    return F.linear(x, weight)  # cuBLAS (and its error messages for mismatched inputs)


def _linear_fake(x, weight):
    return x.new_empty((x.shape[0], weight.shape[0]))


linear_op = define_op(
    "linear(Tensor x, Tensor weight) -> Tensor",
    reference=linear_reference,
    cuda=_linear_cuda,
    fake=_linear_fake,
)


def silu_mul_linear_reference(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(silu_mul_reference(gate_up), weight)


def _silu_mul_linear_cuda(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    if _skinny(gate_up, weight) and gate_up.shape[1] == 2 * weight.shape[1]:
        return gemv_kernels.skinny_gemm(gate_up, weight, gated=True)
    return F.linear(silu_mul_op(gate_up), weight)


silu_mul_linear_op = define_op(
    "silu_mul_linear(Tensor gate_up, Tensor weight) -> Tensor",
    reference=silu_mul_linear_reference,
    cuda=_silu_mul_linear_cuda,
    fake=_linear_fake,  # [rows, N] as linear's
)


def add_rms_norm_linear_reference(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    summed, normed = add_rms_norm_reference(x, residual, norm_weight, eps)
    return F.linear(normed, weight), summed


def norm_in_prologue(rows: int) -> bool:
    """Whether the skinny GEMM computes ce::add_rms_norm_linear's norm in its prologue at ``rows`` rows: at one row
    only. Fused, every program of the GEMV recomputes the rows' statistics and normed values over the whole K for its
    few output columns (~1,000 programs x rows x K values): from two rows that costs more than the hop it saves, and
    ce::add_rms_norm (a PDL launch) computes them once before a prologue-free GEMV. The decode graph at batch 2 / 4:
    0.866 / 1.052 ms fused, 0.784 / 0.953 apart; at one row the two are level in the matmul chain (bench/NOTES.md,
    "Runs 121-124")."""
    return rows == 1


def _add_rms_norm_linear_cuda(x, residual, norm_weight, eps, weight, silu_mul_out=False):
    """``silu_mul_out`` (ce::add_rms_norm_linear_silu_mul): the output is ``silu(gate) * up`` of the projection's
    ``[gate | up]`` halves, written by the skinny GEMM's epilogue where its config has one
    (``gemv_kernels.takes_gated_out``), else by ce::silu_mul after it."""
    skinny = _skinny(x, weight)
    gated_out = silu_mul_out and skinny and gemv_kernels.takes_gated_out(x.shape[0], weight.shape[0], x.shape[1])
    if skinny and norm_in_prologue(x.shape[0]) and residual.dtype == x.dtype and residual.stride(-1) == 1:
        out, summed = gemv_kernels.add_rms_norm_skinny_gemm(x, residual, norm_weight, eps, weight, gated_out=gated_out)
    else:
        summed, normed = add_rms_norm_op(x, residual, norm_weight, eps)
        out = gemv_kernels.skinny_gemm(normed, weight, gated_out=gated_out) if skinny else F.linear(normed, weight)
    return (silu_mul_op(out) if silu_mul_out and not gated_out else out), summed


def _add_rms_norm_linear_fake(x, residual, norm_weight, eps, weight):
    return x.new_empty((x.shape[0], weight.shape[0])), x.new_empty(x.shape)


add_rms_norm_linear_op = define_op(
    "add_rms_norm_linear(Tensor x, Tensor residual, Tensor norm_weight, float eps, Tensor weight) -> (Tensor, Tensor)",
    reference=add_rms_norm_linear_reference,
    cuda=_add_rms_norm_linear_cuda,
    fake=_add_rms_norm_linear_fake,
)


def add_rms_norm_linear_silu_mul_reference(
    x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    out, summed = add_rms_norm_linear_reference(x, residual, norm_weight, eps, weight)
    return silu_mul_reference(out), summed


def _add_rms_norm_linear_silu_mul_cuda(x, residual, norm_weight, eps, weight):
    return _add_rms_norm_linear_cuda(x, residual, norm_weight, eps, weight, silu_mul_out=True)


def _add_rms_norm_linear_silu_mul_fake(x, residual, norm_weight, eps, weight):
    return x.new_empty((x.shape[0], weight.shape[0] // 2)), x.new_empty(x.shape)


add_rms_norm_linear_silu_mul_op = define_op(
    "add_rms_norm_linear_silu_mul(Tensor x, Tensor residual, Tensor norm_weight, float eps, Tensor weight) "
    "-> (Tensor, Tensor)",
    reference=add_rms_norm_linear_silu_mul_reference,
    cuda=_add_rms_norm_linear_silu_mul_cuda,
    fake=_add_rms_norm_linear_silu_mul_fake,
)


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x [..., K] @ weight[N, K].T -> [..., N]`` through ``ce::linear`` (leading dimensions flattened into M)."""
    out = linear_op(x.reshape(-1, x.shape[-1]), weight)
    return out.view(*x.shape[:-1], weight.shape[0])


def silu_mul_linear(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of gate_up ``[..., 2K]``, times ``weight[N, K].T`` -> ``[..., N]`` (``ce::silu_mul_linear``:
    the op in compiled graphs too, since its point is the fusion inside the skinny GEMM)."""
    if gate_up.shape[-1] != 2 * weight.shape[1]:
        raise ValueError(f"silu_mul_linear: gate_up's last dimension must be 2 x weight's ({2 * weight.shape[1]}), "
                         f"got {gate_up.shape[-1]}")
    out = silu_mul_linear_op(gate_up.reshape(-1, gate_up.shape[-1]), weight)
    return out.view(*gate_up.shape[:-1], weight.shape[0])
