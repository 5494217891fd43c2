"""Gated DeltaNet (linear attention) layer with per-sequence conv and recurrent state held in pools by slot.

One fused input projection gives ``[q (Hk*K) | k (Hk*K) | v (Hv*V) | z (Hv*V) | b (Hv) | a (Hv)]`` (the loader brings
Qwen3.5's four projections and Qwen3-Next's grouped ones to this layout). q,k,v go through the causal conv (+SiLU),
then the gated delta rule; the output is normalised by the gated RMSNorm with ``silu(z)`` and projected out. At decode
everything between the two projections is one op, ``ce::gated_deltanet_decode`` (one kernel on CUDA); prefill runs
the unfused varlen ops.

Mutates: ``conv_state`` and ``recurrent_state`` (this layer's pool buffers) at the rows ``step.state_slots``; in a
verify step of speculative decoding (``step.speculative``), its ``conv_history``/``recurrent_history`` instead.

Verify steps: each sequence scores its last token and its k drafts (k + 1 positions), but only the accepted prefix
may enter the pools, and which prefix is known only after the logits. Position 0 (the sequence's last token) is
always accepted, so the layer runs it through the decode op in the pools themselves; positions 1..k run on scratch
rows (a copy of the pools' rows after position 0), the state after each of positions 1..k-1 copied into a history
first (rows ``(i - 1) * N + n``: sequence n after position i). ``commit_verify`` then copies each sequence's state
after its last accepted position into the pools: from the history, from the scratch rows (all accepted), or nothing
(none accepted). The copies are ``ce::copy_state_rows`` (copies a compiled graph keeps). Each position is exactly
what a decode step computes; the cost is k + 1 decode-op calls and k state copies per layer, and at most one copy
to commit (a fused kernel that keeps the k + 1 states on chip is the faster form).
"""

from __future__ import annotations

import torch
from torch import nn

import ops  # noqa: F401  (registers torch.ops.ce)
from compiled_engine.config import ModelConfig
from compiled_engine.distributed import TensorParallel
from compiled_engine.layers import GatedRMSNorm, empty_parameter
from ops.library import NULL_SLOT
from ops.linear import linear
from ops.state_rows import copy_state_rows
from ops.step import StepInputs


class GatedDeltaNet(nn.Module):
    """Sharded over tensor-parallel ranks by key-head groups, each with its value heads, conv channels and state."""

    def __init__(self, config: ModelConfig, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.num_k_heads = config.linear_num_key_heads // tp.world_size
        self.num_v_heads = config.linear_num_value_heads // tp.world_size
        self.head_k_dim = config.linear_key_head_dim
        self.head_v_dim = config.linear_value_head_dim
        key_dim = self.num_k_heads * self.head_k_dim
        value_dim = self.num_v_heads * self.head_v_dim
        self.conv_dim = 2 * key_dim + value_dim
        self.split_sizes = [self.conv_dim, value_dim, self.num_v_heads, self.num_v_heads]  # qkv | z | b | a
        self.qkv_split = [key_dim, key_dim, value_dim]
        self.in_proj = empty_parameter(sum(self.split_sizes), config.hidden_size)
        self.conv_weight = empty_parameter(self.conv_dim, config.linear_conv_kernel_dim)
        self.A_log = empty_parameter(self.num_v_heads)
        self.dt_bias = empty_parameter(self.num_v_heads)
        self.norm = GatedRMSNorm(self.head_v_dim, config.rms_norm_eps)
        self.out_proj = empty_parameter(config.hidden_size, value_dim)
        # [num_slots, conv_dim, kernel - 1] and [num_slots, Hv, K, V], allocated by cache.allocate_state_pools.
        # Buffers, so that torch.compile treats them as static addresses (mutated plain inputs skip CUDA graphs).
        self.register_buffer("conv_state", None, persistent=False)
        self.register_buffer("recurrent_state", None, persistent=False)
        # Verify steps only (cache.allocate_verify_history): the history, [(k - 1) * rows, conv_dim, kernel - 1] and
        # [(k - 1) * rows, Hv, K, V], and the scratch rows the decode op runs on, [rows, ...] each.
        self.register_buffer("conv_history", None, persistent=False)
        self.register_buffer("recurrent_history", None, persistent=False)
        self.register_buffer("conv_scratch", None, persistent=False)
        self.register_buffer("recurrent_scratch", None, persistent=False)

    @property
    def input_weight(self) -> nn.Parameter:
        """The input projection's weight: the decoder layer runs that projection, fused with the norm before it."""
        return self.in_proj

    def forward(self, projected: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """From the in_proj output ``[T, P]`` to the out_proj output ``[T, hidden]``."""
        if step.speculative:
            o = self._verify(projected, step)
        else:
            o = self._prefill(projected, step) if step.is_prefill else self._decode(projected, step)
        return self.tp.all_reduce(linear(o, self.out_proj))  # out_proj is row-parallel

    def _decode(self, projected: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """One token per sequence: conv, delta rule and gated norm in one op (one kernel on CUDA) -> [B, Hv*V]."""
        return torch.ops.ce.gated_deltanet_decode(
            projected, self.conv_weight, self.conv_state, self.A_log, self.dt_bias, self.norm.weight,
            self.recurrent_state, step.state_slots, self.num_k_heads, self.head_k_dim, self.num_v_heads,
            self.head_v_dim, self.norm.eps,
        )

    def _verify(self, projected: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """Each sequence's ``positions`` tokens (rows grouped by sequence), one position at a time through the decode
        op (see the module docstring): the first in the pools, the others on the scratch rows, the states between
        them kept in the history -> [T, Hv*V]."""
        n = step.num_sequences
        positions = projected.shape[0] // n
        if (positions - 2) * n > self.recurrent_history.shape[0] or n > self.recurrent_scratch.shape[0]:
            raise ValueError(f"a verify step of {n} sequences x {positions} positions exceeds the verify history "
                             f"({self.recurrent_scratch.shape[0]} sequences)")
        per_position = projected.view(n, positions, -1)
        rows = torch.arange(n, device=projected.device, dtype=torch.int32)
        outputs = []
        for i in range(positions):
            if i == 1:  # position 0 ran in the pools (it is always committed): the others start from there
                copy_state_rows(self.conv_scratch, self.recurrent_scratch, rows, self.conv_state,
                                self.recurrent_state, step.state_slots)
            elif i > 1:  # keep the state after position i - 1 before position i overwrites it
                copy_state_rows(self.conv_history, self.recurrent_history, rows + (i - 2) * n, self.conv_scratch,
                                self.recurrent_scratch, rows)
            in_pools = i == 0
            outputs.append(torch.ops.ce.gated_deltanet_decode(
                per_position[:, i], self.conv_weight, self.conv_state if in_pools else self.conv_scratch, self.A_log,
                self.dt_bias, self.norm.weight, self.recurrent_state if in_pools else self.recurrent_scratch,
                step.state_slots if in_pools else rows, self.num_k_heads, self.head_k_dim, self.num_v_heads,
                self.head_v_dim, self.norm.eps,
            ))
        return torch.stack(outputs, dim=1).reshape(n * positions, -1)

    def commit_verify(self, slots: torch.Tensor, num_accepted: torch.Tensor, num_drafts: int) -> None:
        """After a verify step of ``num_drafts`` drafts a sequence: the pools at ``slots`` [N] take the state after
        each sequence's last accepted position (``num_accepted`` [N] int64 drafts accepted, on the device: no host
        sync). None accepted: the pools hold it already; all: the scratch rows; else the history. Sequences that take
        nothing from a source copy into the null slot instead."""
        n = slots.shape[0]
        rows = torch.arange(n, device=slots.device)
        null = torch.full_like(slots, NULL_SLOT)
        copy_state_rows(self.conv_state, self.recurrent_state, torch.where(num_accepted == num_drafts, slots, null),
                        self.conv_scratch, self.recurrent_scratch, rows)
        if num_drafts > 1:
            middle = (num_accepted >= 1) & (num_accepted < num_drafts)
            source = torch.where(middle, (num_accepted - 1) * n + rows, rows)  # any valid row for the others
            copy_state_rows(self.conv_state, self.recurrent_state, torch.where(middle, slots, null),
                            self.conv_history, self.recurrent_history, source)

    def _prefill(self, projected: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """Varlen tokens packed by ``step.cu_seqlens``: unfused conv, chunked delta rule, gated norm -> [T, Hv*V]."""
        tokens = projected.shape[0]
        mixed_qkv, z, b, a = projected.split(self.split_sizes, dim=-1)
        mixed_qkv = torch.ops.ce.causal_conv1d_prefill(
            mixed_qkv, self.conv_weight, self.conv_state, step.cu_seqlens, step.state_slots
        )
        q, k, v = mixed_qkv.split(self.qkv_split, dim=-1)
        q = q.reshape(tokens, self.num_k_heads, self.head_k_dim)
        k = k.reshape(tokens, self.num_k_heads, self.head_k_dim)
        v = v.reshape(tokens, self.num_v_heads, self.head_v_dim)
        # The step's own cu_seqlens_long and chunk_indices objects, the same in every layer: FLA derives nothing from
        # them with a host sync, and memoises the rest on their identity (ops/delta_rule.py).
        o = torch.ops.ce.gated_delta_rule_prefill(
            q, k, v, a.contiguous(), b.contiguous(), self.A_log, self.dt_bias, self.recurrent_state, step.cu_seqlens,
            step.state_slots, step.cu_seqlens_long, step.chunk_indices,
        )
        o = self.norm(o, z.reshape(tokens, self.num_v_heads, self.head_v_dim))
        return o.reshape(tokens, -1)
