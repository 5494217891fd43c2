"""Full-attention (GQA) layer with an output gate, over the paged KV cache.

Per token: ``[q_h | gate_h]`` per head from the doubled q projection; q_norm/k_norm (zero-centred RMSNorm over
head_dim) before partial RoPE; the new K/V are stored into the cache, then paged attention reads every cached
token of the sequence; ``out = o_proj(attn * sigmoid(gate))``. With the "triton" backend, decode does everything
between qkv_proj and o_proj in one op, ``ce::attention_decode``; prefill, speculative decoding's verify step
(``ce::paged_attention_verify``) and the flash-attn backend run the unfused ops.

Mutates: ``k_cache`` and ``v_cache`` (this layer's buffers) at ``step.slot_mapping``.
"""

from __future__ import annotations

import torch
from torch import nn

import ops  # noqa: F401  (registers torch.ops.ce)
from compiled_engine.config import ModelConfig
from compiled_engine.distributed import TensorParallel
from compiled_engine.layers import RMSNorm, RotaryEmbedding, empty_parameter
from ops.step import StepInputs
from ops.linear import linear


ATTENTION_BACKENDS = ("triton", "flash_attn")


class FullAttention(nn.Module):
    """Sharded over tensor-parallel ranks by KV-head groups: this rank keeps 1/world of the query and KV heads.

    ``backend``: "triton" (our kernels, the default) or "flash_attn" (ops/flash_attention.py, where installed).
    """

    def __init__(self, config: ModelConfig, tp: TensorParallel, backend: str = "triton"):
        super().__init__()
        if backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {backend!r}")
        self.tp = tp
        flash = backend == "flash_attn"
        # Decode: "triton" runs ce::attention_decode; "flash_attn" the unfused ops around flash-attn's decode kernel.
        self.fused_decode = not flash
        self.prefill_op = torch.ops.ce.flash_paged_attention_prefill if flash else torch.ops.ce.paged_attention_prefill
        # A verify step (speculative decoding: the same rows for every sequence): its own op, whose kernel suits a
        # few sequences' short queries ("triton"); flash-attn runs its prefill.
        self.verify_op = None if flash else torch.ops.ce.paged_attention_verify
        self.num_heads = config.num_attention_heads // tp.world_size
        self.num_kv_heads = config.num_key_value_heads // tp.world_size
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        q_rows = 2 * self.num_heads * self.head_dim  # query and gate, interleaved per head
        kv_rows = self.num_kv_heads * self.head_dim
        self.split_sizes = [q_rows, kv_rows, kv_rows]
        self.qkv_proj = empty_parameter(q_rows + 2 * kv_rows, config.hidden_size)  # q_proj | k_proj | v_proj
        self.o_proj = empty_parameter(config.hidden_size, self.num_heads * self.head_dim)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.rotary_dim, config.rope_theta)
        # [num_blocks, block_size, kv_heads, head_dim] each, allocated by compiled_engine.cache.allocate_kv_cache.
        # Buffers, so that torch.compile treats them as static addresses (mutated plain inputs skip CUDA graphs).
        self.register_buffer("k_cache", None, persistent=False)
        self.register_buffer("v_cache", None, persistent=False)

    @property
    def input_weight(self) -> nn.Parameter:
        """The input projection's weight: the decoder layer runs that projection, fused with the norm before it."""
        return self.qkv_proj

    def forward(self, projected: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """From the qkv_proj output ``[T, q_gate | k | v]`` to the o_proj output ``[T, hidden]``."""
        if self.fused_decode and not step.is_prefill:
            gated = self._fused_decode(projected, step)
        else:
            gated = self._unfused(projected, step)
        return self.tp.all_reduce(linear(gated, self.o_proj))  # o_proj is row-parallel

    def _fused_decode(self, projected: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """One token per sequence: norms, RoPE, KV store, paged attention and the gate in one op -> [B, Hq*D]."""
        return torch.ops.ce.attention_decode(
            projected, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, self.rotary.inv_freq, step.positions,
            self.k_cache, self.v_cache, step.slot_mapping, step.block_tables, step.context_lens, self.num_heads,
            self.num_kv_heads, self.head_dim, self.scale,
        )

    def _unfused(self, projected: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """Prefill (varlen), verify, and decode with the flash-attn backend: norms, RoPE and the KV store in one op,
        then attention, then the gate (the verify op's own) -> [T, Hq*D]."""
        tokens = projected.shape[0]
        q = torch.ops.ce.attention_prologue(
            projected, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, self.rotary.inv_freq, step.positions,
            self.k_cache, self.v_cache, step.slot_mapping, self.num_heads, self.num_kv_heads, self.head_dim,
        )
        gate = projected[:, : self.split_sizes[0]].view(tokens, self.num_heads, 2 * self.head_dim)[..., self.head_dim :]
        if step.speculative and self.verify_op is not None:  # the gate in the op's last pass
            return self.verify_op(q, self.k_cache, self.v_cache, step.context_lens, step.block_tables,
                                  tokens // step.num_sequences, self.scale, gate).reshape(tokens, -1)
        if step.is_prefill:
            attn = self.prefill_op(
                q, self.k_cache, self.v_cache, step.cu_seqlens, step.context_lens, step.block_tables, self.scale
            )
        else:  # only the flash-attn backend decodes here
            attn = torch.ops.ce.flash_paged_attention_decode(
                q, self.k_cache, self.v_cache, step.block_tables, step.context_lens, self.scale
            )
        return attn.reshape(tokens, -1) * torch.sigmoid(gate.reshape(tokens, -1))
