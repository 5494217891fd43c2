"""``ce::rms_norm``: the model's RMSNorms (zero-centred, and gated by ``silu(gate)``) in one pass over the rows.

Why an op: outside a compiled graph (every prefill step, ``enforce_eager`` decode) the plain-torch norm is ~8
kernels over the activations (``float()``, ``pow``, ``mean``, ``rsqrt``, the weight multiply, the casts); the kernel
reads each row once and writes it once. With ``ce::silu_mul`` (ops/activation.py) this takes about a third off a
prefill step's GPU time and launches (bench/NOTES.md, "Norm and activation ops").

Inside ``torch.compile`` (the decode graphs) :func:`rms_norm` runs the plain-torch definition instead: Inductor
fuses it with its neighbours (the residual add before it, the cast after it), which an opaque op would prevent.

* ``ce::rms_norm(x [T, H, D], weight [D], gate [T, H, D] or None, eps, zero_centred) -> [T, H, D]`` contiguous, in
  x's dtype. x and gate may have any strides over T and H; their last dimension must be contiguous (the views the
  model passes: a head's slice of a fused projection's output row).
* :func:`rms_norm`: the model's entry point, for x of shape ``[..., D]`` with 2 or 3 dimensions.
* ``ce::add_rms_norm(x [T, D], residual [T, D], weight [D], eps) -> (residual + x, the zero-centred norm of it)``: a
  decoder layer's residual add and the norm that follows, one kernel in every step, compiled graphs included (it is
  launched with PDL, so at batch 1 the weight matmul after it starts loading while it runs: ops/triton/pdl.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ops.library import define_op
from ops.triton import HAVE_TRITON

if HAVE_TRITON:  # else the references serve CUDA too (ops/triton/__init__.py)
    from ops.triton import norm_kernels


def rms_norm_reference(
    x: torch.Tensor, weight: torch.Tensor, gate: torch.Tensor | None, eps: float, zero_centred: bool
) -> torch.Tensor:
    """The definition (Qwen3.5 / Qwen3-Next), rounding where the HF modules round.

    zero_centred (layer norms, q/k norms): ``x * rsqrt(mean(x^2) + eps) * (1 + w)``, all in fp32, cast once.
    gated (the linear-attention output norm): the normalised x is cast to x's dtype, scaled by ``w`` in that dtype,
    then multiplied by ``silu(gate)`` in fp32 and cast.
    """
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if gate is None:
        if not zero_centred:
            raise ValueError("rms_norm without a gate is the zero-centred norm (the only ungated one the model has)")
        return (xf * rstd * (1.0 + weight.float())).to(x.dtype)
    if zero_centred:
        raise ValueError("the gated rms_norm is not zero-centred")
    normed = (xf * rstd).to(x.dtype)
    return ((weight * normed) * F.silu(gate.float())).to(x.dtype)


def _rms_norm_fake(x, weight, gate, eps, zero_centred):
    return x.new_empty(x.shape)  # contiguous, like the reference and the kernel


rms_norm_op = define_op(
    "rms_norm(Tensor x, Tensor weight, Tensor? gate, float eps, bool zero_centred) -> Tensor",
    reference=rms_norm_reference,
    cuda=norm_kernels.rms_norm if HAVE_TRITON else None,
    fake=_rms_norm_fake,
)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, zero_centred: bool, gate: torch.Tensor | None = None
) -> torch.Tensor:
    """RMSNorm over the last dimension of x ``[T, D]`` or ``[T, H, D]`` (see the module docstring for which path)."""
    if torch.compiler.is_compiling():
        return rms_norm_reference(x, weight, gate, eps, zero_centred)
    if x.dim() not in (2, 3):
        raise ValueError(f"rms_norm takes x of shape [T, D] or [T, H, D], got {tuple(x.shape)}")
    if x.dim() == 2:
        gate3 = None if gate is None else gate.unsqueeze(1)
        return rms_norm_op(x.unsqueeze(1), weight, gate3, eps, zero_centred).view(x.shape)
    return rms_norm_op(x, weight, gate, eps, zero_centred)


def add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``summed = residual + x`` (in x's dtype, as HF's residual adds), then its zero-centred norm."""
    summed = residual + x
    return summed, rms_norm_reference(summed, weight, None, eps, True)


def _add_rms_norm_fake(x, residual, weight, eps):
    return x.new_empty(x.shape), x.new_empty(x.shape)


add_rms_norm_op = define_op(
    "add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor, Tensor)",
    reference=add_rms_norm_reference,
    cuda=norm_kernels.add_rms_norm if HAVE_TRITON else None,
    fake=_add_rms_norm_fake,
)
