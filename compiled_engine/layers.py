"""Small building blocks shared by the decoder layers: norms, rotary embedding, MLP.

Weights are plain ``nn.Parameter``s created on the ``meta`` device and filled by the loader (no random init, no
second copy). Fused projections (``gate_up_proj`` here, ``qkv_proj``/``in_proj`` in the mixers) are one GEMM
instead of two or four.
"""

from __future__ import annotations

import torch
from torch import nn

from compiled_engine.distributed import TensorParallel
from ops.linear import add_rms_norm_linear_op, add_rms_norm_linear_silu_mul_op, linear
from ops.norm import add_rms_norm_op, rms_norm


def empty_parameter(*shape: int) -> nn.Parameter:
    """A parameter with no storage yet; the loader materialises it on the target device and dtype."""
    return nn.Parameter(torch.empty(*shape, device="meta"), requires_grad=False)


class RMSNorm(nn.Module):
    """Zero-centred RMSNorm (Qwen3.5/Qwen3-Next): ``x * rsqrt(mean(x^2) + eps) * (1 + w)``, computed in fp32.

    The math is ops/norm.py's ``rms_norm_reference`` (one kernel per call outside compiled graphs)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = empty_parameter(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, zero_centred=True)

    def add_and_norm(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(residual + x, norm(residual + x))`` for ``[T, D]`` rows, in one kernel (ce::add_rms_norm)."""
        return add_rms_norm_op(x, residual, self.weight, self.eps)

    def add_norm_linear(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(residual + x) @ weight.T, residual + x)`` through ce::add_rms_norm_linear: at decode batch 1 one
        kernel, the norm in the projection's prologue (ops/linear.py)."""
        return add_rms_norm_linear_op(x, residual, self.weight, self.eps, weight)

    def add_norm_gate_up(
        self, x: torch.Tensor, residual: torch.Tensor, gate_up_weight: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(silu(gate) * up, residual + x)`` of ``norm(residual + x) @ gate_up_weight.T = [gate | up]`` through
        ce::add_rms_norm_linear_silu_mul: up to 5 rows (decode batches 1-4, small verify steps) the projection's
        programs write the activation (ops/linear.py), so the MLP's down projection reads it with no prologue."""
        return add_rms_norm_linear_silu_mul_op(x, residual, self.weight, self.eps, gate_up_weight)


class GatedRMSNorm(nn.Module):
    """The linear-attention output norm: NOT zero-centred, gated by ``silu(z)``; weight shared by value heads."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = empty_parameter(dim)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, zero_centred=False, gate=gate)


class RotaryEmbedding(nn.Module):
    """NeoX (rotate-half) RoPE on the first ``rotary_dim`` channels of each head (partial rotary): its inverse
    frequencies, which the attention ops take (the math: ``rotary_reference`` in ops/attention_prologue.py).

    Qwen3.5's interleaved M-RoPE reduces to this for text, where the three position streams are equal.
    """

    def __init__(self, rotary_dim: int, theta: float):
        super().__init__()
        # Built on the CPU even when the model is constructed on ``meta``: it is derived, not loaded.
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device="cpu") / rotary_dim
        inv_freq = 1.0 / (theta**exponents)
        self.register_buffer("inv_freq", inv_freq, persistent=False)


class MLP(nn.Module):
    """SwiGLU MLP with gate and up projections fused into one GEMM.

    Tensor parallel: gate_up is column-parallel, down_proj row-parallel (one all-reduce).
    """

    def __init__(self, hidden_size: int, intermediate_size: int, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.intermediate_size = intermediate_size // tp.world_size
        self.gate_up_proj = empty_parameter(2 * self.intermediate_size, hidden_size)
        self.down_proj = empty_parameter(hidden_size, self.intermediate_size)

    def down(self, activated: torch.Tensor) -> torch.Tensor:
        """The MLP after its gate_up projection and activation (which the decoder layer fuses with the norm before
        them: ``RMSNorm.add_norm_gate_up``): the down projection of ``silu(gate) * up``."""
        return self.tp.all_reduce(linear(activated, self.down_proj))
