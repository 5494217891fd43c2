"""Gated DeltaNet (linear attention) layer with per-sequence conv and recurrent state held in pools by slot.

One fused input projection gives ``[q (Hk*K) | k (Hk*K) | v (Hv*V) | z (Hv*V) | b (Hv) | a (Hv)]`` (the loader brings
Qwen3.5's four projections and Qwen3-Next's grouped ones to this layout). q,k,v go through the causal conv (+SiLU),
then the gated delta rule; the output is normalised by the gated RMSNorm with ``silu(z)`` and projected out. At decode
everything between the two projections is one op, ``ce::gated_deltanet_decode`` (one kernel on CUDA); prefill runs
the unfused varlen ops. A prefill step's leading decode rows (``StepInputs.decode_rows``: a mixed step's running
requests, one token each) take the decode op, the rest the varlen ops: through the varlen path a one-token sequence
is a chunk of its own in every FLA kernel and its state is moved ~5 times (gathered, read as FLA's initial state,
written and read as its chunk state, written as its final state and scattered), where the decode op reads and
writes it once.

Mutates: ``conv_state`` and ``recurrent_state`` (this layer's pool buffers) at the rows ``step.state_slots``; in a
verify step of speculative decoding (``step.speculative``), its ``verify_history`` instead.

Verify steps: each sequence scores its last token and its k drafts (k + 1 positions), but only the accepted prefix
may enter the pools, and which prefix is known only after the logits. ``ce::gated_deltanet_verify`` runs the k + 1
positions of every sequence in one kernel from the pools' states without writing them, keeping in the layer's
``verify_history`` what each position adds to the state (its conv inputs, keys, delta-rule updates and decays);
``commit_verify`` then replays the accepted prefix into the pools of every layer (``ce::gated_deltanet_commit``, one
kernel for all of them: the accepted count stays on the device). Each position computes what a decode step
computes; the state is read once by the verify and read and written once by the commit
(ops/gated_deltanet_verify.py).
"""

from __future__ import annotations

import torch
from torch import nn

import ops  # noqa: F401  (registers torch.ops.ce)
from compiled_engine.config import ModelConfig
from compiled_engine.distributed import TensorParallel
from compiled_engine.layers import GatedRMSNorm, empty_parameter
from ops.linear import linear
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
        # Verify steps only (cache.allocate_verify_history): [rows, k + 1, D] fp32, what each position of a verify
        # step adds to a sequence's state (ops/layouts.py gated_deltanet_history_offsets).
        self.register_buffer("verify_history", None, persistent=False)

    @property
    def input_weight(self) -> nn.Parameter:
        """The input projection's weight: the decoder layer runs that projection, fused with the norm before it."""
        return self.in_proj

    def forward(self, projected: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """From the in_proj output ``[T, P]`` to the out_proj output ``[T, hidden]``."""
        if step.speculative:
            o = self._verify(projected, step)
        else:
            o = self._prefill(projected, step) if step.is_prefill else self._decode(projected, step.state_slots)
        return self.tp.all_reduce(linear(o, self.out_proj))  # out_proj is row-parallel

    def _decode(self, projected: torch.Tensor, state_slots: torch.Tensor) -> torch.Tensor:
        """One token per sequence: conv, delta rule and gated norm in one op (one kernel on CUDA) -> [B, Hv*V]."""
        return torch.ops.ce.gated_deltanet_decode(
            projected, self.conv_weight, self.conv_state, self.A_log, self.dt_bias, self.norm.weight,
            self.recurrent_state, state_slots, self.num_k_heads, self.head_k_dim, self.num_v_heads,
            self.head_v_dim, self.norm.eps,
        )

    def _verify(self, projected: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """Each sequence's ``positions`` tokens (rows grouped by sequence) in one op, the pools only read, what each
        position adds to the state kept in the verify history -> [T, Hv*V]."""
        n = step.num_sequences
        rows, positions = self.verify_history.shape[:2]
        if n > rows or projected.shape[0] > n * positions:
            raise ValueError(f"a verify step of {n} sequences x {projected.shape[0] // max(n, 1)} positions exceeds "
                             f"the verify history ({rows} sequences x {positions} positions)")
        return torch.ops.ce.gated_deltanet_verify(
            projected, self.conv_weight, self.conv_state, self.A_log, self.dt_bias, self.norm.weight,
            self.recurrent_state, step.state_slots, self.verify_history, self.num_k_heads, self.head_k_dim,
            self.num_v_heads, self.head_v_dim, self.norm.eps,
        )

    def _prefill(self, projected: torch.Tensor, step: StepInputs) -> torch.Tensor:
        """The step's decode rows through the decode op, then its prompt part -> [T, Hv*V]."""
        d = step.decode_rows
        if d == 0:
            return self._chunked(projected, step.cu_seqlens, step.state_slots, step)
        rows = self._decode(projected[:d], step.state_slots[:d])
        if d == projected.shape[0]:  # every sequence a decode row (an eager step: a captured one has a prompt part)
            return rows
        return torch.cat([rows, self._chunked(projected[d:], step.prompt_cu_seqlens, step.state_slots[d:], step)])

    def _chunked(self, projected: torch.Tensor, cu_seqlens: torch.Tensor, state_slots: torch.Tensor,
                 step: StepInputs) -> torch.Tensor:
        """Varlen tokens packed by ``cu_seqlens``: unfused conv, chunked delta rule, gated norm -> [T, Hv*V]."""
        tokens = projected.shape[0]
        mixed_qkv, z, b, a = projected.split(self.split_sizes, dim=-1)
        q, k, v = torch.ops.ce.causal_conv1d_prefill(
            mixed_qkv, self.conv_weight, self.conv_state, cu_seqlens, state_slots, self.qkv_split
        )
        q = q.reshape(tokens, self.num_k_heads, self.head_k_dim)
        k = k.reshape(tokens, self.num_k_heads, self.head_k_dim)
        v = v.reshape(tokens, self.num_v_heads, self.head_v_dim)
        # The step's own cu_seqlens_long and chunk_indices objects, the same in every layer: FLA derives nothing from
        # them with a host sync, and memoises the rest on their identity (ops/delta_rule.py).
        o = torch.ops.ce.gated_delta_rule_prefill(
            q, k, v, a, b, self.A_log, self.dt_bias, self.recurrent_state, cu_seqlens,
            state_slots, step.cu_seqlens_long, step.chunk_indices, step.graphed,
        )
        o = self.norm(o, z.reshape(tokens, self.num_v_heads, self.head_v_dim))
        return o.reshape(tokens, -1)


def commit_verify(layers: list[GatedDeltaNet], slots: torch.Tensor, num_accepted: torch.Tensor) -> None:
    """After a verify step: the pools of every one of ``layers`` at ``slots`` [N] (the step's state slots) take the
    state after each sequence's last accepted position (``num_accepted`` [N] int64 drafts accepted, on the device: no
    host sync). One ``ce::gated_deltanet_commit`` for all the layers: one launch."""
    if not layers:
        return
    first = layers[0]
    torch.ops.ce.gated_deltanet_commit(
        [m.conv_state for m in layers], [m.recurrent_state for m in layers], slots,
        [m.verify_history for m in layers], num_accepted, first.num_k_heads, first.head_k_dim, first.num_v_heads,
        first.head_v_dim,
    )
