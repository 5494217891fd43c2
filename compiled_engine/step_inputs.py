"""StepInputs: everything one forward step needs besides the weights and the caches, as tensors.

The scheduler (or the Runtime step API) builds one per step; the model reads it and nothing else. No globals: a
reader can see every input of a step here, and every tensor the step mutates is a cache/pool buffer of a layer.

Prefill packs the new tokens of N sequences back to back (varlen); decode has exactly one token per sequence,
so T == N. In a bucketed (CUDA-graphed) decode batch, padding lanes point at the null slot and the null block
with ``context_lens == 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class StepInputs:
    input_ids: torch.Tensor  # [T] int64: the new tokens
    positions: torch.Tensor  # [T] int64: their absolute positions (RoPE)
    slot_mapping: torch.Tensor  # [T] int64: KV-cache row (block * block_size + offset) each new token is written to
    block_tables: torch.Tensor  # [N, max_blocks] int32: KV blocks of each sequence (0 = null block beyond its end)
    context_lens: torch.Tensor  # [N] int32: cached tokens of each sequence after this step (prefix + new)
    state_slots: torch.Tensor  # [N] int32: the row of each sequence in every linear layer's state pools
    cu_seqlens: torch.Tensor | None = None  # [N + 1] int32: prefill only; sequence n owns tokens [cu[n], cu[n+1])
    is_prefill: bool = False  # a Python bool: prefill and decode are different graphs

    @property
    def num_sequences(self) -> int:
        return self.state_slots.shape[0]

    def last_token_indices(self) -> torch.Tensor:
        """Index of each sequence's last new token in the packed token dimension."""
        if self.is_prefill:
            return (self.cu_seqlens[1:] - 1).long()
        return torch.arange(self.input_ids.shape[0], device=self.input_ids.device)
