"""``ce::silu_mul``: the SwiGLU MLP's ``silu(gate) * up`` from the fused gate_up projection, in one pass.

Why an op: outside a compiled graph (every prefill step) the plain-torch form is two kernels (``silu`` writes a
``[T, I]`` tensor, the multiply reads it back) over the widest activations of the model (I = 3,584 for Qwen3.5-0.8B);
the kernel reads gate and up once and writes the product once (measured together with ``ce::rms_norm``: bench/NOTES.md,
"Norm and activation ops"). The model reaches it through ``ce::add_rms_norm_linear_silu_mul`` (a dense MLP's gate_up)
and ``ce::silu_mul_linear`` (a sparse MoE block's shared expert), ops/linear.py, whose skinny GEMMs compute the
activation themselves at decode batch sizes and call this op above them.

* ``ce::silu_mul(gate_up [T, 2I]) -> [T, I]`` contiguous, in gate_up's dtype: gate is the first half of each row,
  up the second (the layout of the fused ``gate_up_proj``). Rows may be strided; the columns must be contiguous.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ops.library import define_op
from ops.triton import HAVE_TRITON

if HAVE_TRITON:  # else the references serve CUDA too (ops/triton/__init__.py)
    from ops.triton import activation_kernels


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up``, rounded where the HF module rounds: silu's output in the input dtype, then the product."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def _silu_mul_fake(gate_up):
    return gate_up.new_empty((gate_up.shape[0], gate_up.shape[1] // 2))


silu_mul_op = define_op(
    "silu_mul(Tensor gate_up) -> Tensor",
    reference=silu_mul_reference,
    cuda=activation_kernels.silu_mul if HAVE_TRITON else None,
    fake=_silu_mul_fake,
)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of gate_up ``[..., 2I]`` -> ``[..., I]`` through ``ce::silu_mul``."""
    if gate_up.shape[-1] % 2:
        raise ValueError(f"silu_mul needs an even last dimension (gate | up), got {gate_up.shape[-1]}")
    out = silu_mul_op(gate_up.reshape(-1, gate_up.shape[-1]))
    return out.view(*gate_up.shape[:-1], gate_up.shape[-1] // 2)
