"""StepInputs: everything one forward step needs besides the weights and the caches, as tensors.

The scheduler (or the Runtime step API) builds one per step; the model reads it and nothing else. No globals: a
reader can see every input of a step here, and every tensor the step mutates is a cache/pool buffer of a layer.

Prefill packs the new tokens of N sequences back to back (varlen); decode has exactly one token per sequence,
so T == N. In a bucketed (CUDA-graphed) decode batch, padding lanes point at the null slot and the null block
with ``context_lens == 0``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence as Seq

import numpy as np
import torch

from ops.library import NULL_BLOCK

if TYPE_CHECKING:
    from compiled_engine.sequence import Sequence


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


def pack_step(seqs: Seq["Sequence"], counts: Seq[int], is_prefill: bool, block_size: int, device: torch.device) -> StepInputs:
    """The StepInputs of computing the next ``counts[i]`` tokens of each sequence (its blocks already reserved).

    Reads each sequence's tokens, ``num_computed_tokens`` and ``block_table``; changes nothing. Every field is
    packed into one int64 and one int32 host buffer, each moved to ``device`` in a single pinned, asynchronous copy;
    the fields are views of those two device tensors. (One ``torch.tensor(..., device="cuda")`` per field would be
    seven copies from pageable memory, each of which waits for the GPU to go idle first.)
    """
    starts = [seq.num_computed_tokens for seq in seqs]
    if is_prefill:
        input_ids, positions, slot_mapping, cu_seqlens = [], [], [], [0]
        for seq, start, n in zip(seqs, starts, counts):
            table = seq.block_table
            input_ids.extend(seq.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            slot_mapping.extend(table[p // block_size] * block_size + p % block_size for p in range(start, start + n))
            cu_seqlens.append(cu_seqlens[-1] + n)
    else:  # one token each: the per-sequence loop above, unrolled (this runs every decode step, for up to 256 rows)
        input_ids = [seq.token_ids[start] for seq, start in zip(seqs, starts)]
        positions = starts
        slot_mapping = [seq.block_table[p // block_size] * block_size + p % block_size for seq, p in zip(seqs, starts)]
        cu_seqlens = []
    num_seqs, num_tokens = len(seqs), len(input_ids)
    context_lens = [start + n for start, n in zip(starts, counts)]
    state_slots = [seq.state_slot for seq in seqs]
    width = max(len(seq.block_table) for seq in seqs)
    head = len(context_lens) + len(state_slots) + len(cu_seqlens)
    packed32 = np.full(head + num_seqs * width, NULL_BLOCK, dtype=np.int32)  # tables: the null block beyond their end
    packed32[:head] = context_lens + state_slots + cu_seqlens
    for row, seq in zip(packed32[head:].reshape(num_seqs, width), seqs):
        row[: len(seq.block_table)] = seq.block_table
    int64 = torch.tensor(input_ids + positions + slot_mapping, dtype=torch.long)
    int32 = torch.from_numpy(packed32)
    if device.type == "cuda":
        int64 = int64.pin_memory().to(device, non_blocking=True)
        int32 = int32.pin_memory().to(device, non_blocking=True)
    elif device.type != "cpu":
        int64, int32 = int64.to(device), int32.to(device)
    t, n = num_tokens, num_seqs
    return StepInputs(
        input_ids=int64[:t],
        positions=int64[t : 2 * t],
        slot_mapping=int64[2 * t :],
        block_tables=int32[head:].view(n, width),
        context_lens=int32[:n],
        state_slots=int32[n : 2 * n],
        cu_seqlens=int32[2 * n : head] if is_prefill else None,
        is_prefill=is_prefill,
    )
