"""``ce::advance_decode_inputs``: the decode graph's last op turns its step's inputs into the next step's.

Why: at batch 1 the GPU time between two decode graphs was the step's copies: the inputs' host -> device copy and the
greedy tokens' device -> host copy, ~17 µs of a 0.73 ms step on an H200 for ~4 µs of transfers (bench latency's
``engine_between_graphs``). In the steady state the next step is predictable: the same sequences, one position
further, their greedy tokens as input ids (already in place: ``ce::argmax``'s ``next_input_ids``). So the graph
writes that prediction itself, and the host copies inputs only where its step differs from it
(graphs/static_inputs.py); and the graph writes the tokens straight into host memory, a row of a small ring the host
reads once the graph is done, instead of a copy after the graph.

``ce::advance_decode_inputs(input_ids [B], positions [B]!, slot_mapping [B]!, context_lens [B]!, block_tables [B, W],
token_ring [K, >= B]!, ring_slot [1]!, block_size)``:
  * ``token_ring[ring_slot % K, :B] = input_ids`` (by then the step's greedy tokens), then ``ring_slot += 1``;
  * for every live row (``context_lens > 0``; padding lanes are left as they are): ``positions += 1``,
    ``context_lens += 1``, ``slot_mapping`` = the KV row of the new position in the row's block table (the null
    block's when the table does not reach it yet: the host, which reserves that block, then copies the step in).
"""

from __future__ import annotations

import torch

from ops.library import NULL_BLOCK, define_op
from ops.triton import lazy_kernel


def advance_decode_inputs_reference(
    input_ids: torch.Tensor,  # [B] int64: the step's greedy tokens (ce::argmax wrote them)
    positions: torch.Tensor,  # [B] int64 (written)
    slot_mapping: torch.Tensor,  # [B] int64 (written)
    context_lens: torch.Tensor,  # [B] int32 (written)
    block_tables: torch.Tensor,  # [B, W] int32
    token_ring: torch.Tensor,  # [K, R >= B] int64 (written): host-visible memory on a GPU
    ring_slot: torch.Tensor,  # [1] int64 (written)
    block_size: int,
) -> None:
    rows, width = block_tables.shape
    slot = int(ring_slot[0]) % token_ring.shape[0]
    token_ring[slot, :rows] = input_ids
    ring_slot += 1
    live = context_lens > 0
    position = positions + 1
    block_index = position // block_size
    in_table = block_index < width
    blocks = block_tables.gather(1, block_index.clamp(max=width - 1)[:, None])[:, 0].long()
    blocks = torch.where(in_table, blocks, torch.full_like(blocks, NULL_BLOCK))
    slot_mapping.copy_(torch.where(live, blocks * block_size + position % block_size, slot_mapping))
    positions.copy_(torch.where(live, position, positions))
    context_lens.copy_(torch.where(live, context_lens + 1, context_lens))


def _advance_decode_inputs_fake(input_ids, positions, slot_mapping, context_lens, block_tables, token_ring, ring_slot,
                                block_size) -> None:
    return None


advance_decode_inputs = define_op(
    "advance_decode_inputs(Tensor input_ids, Tensor(a!) positions, Tensor(b!) slot_mapping, Tensor(c!) context_lens, "
    "Tensor block_tables, Tensor(d!) token_ring, Tensor(e!) ring_slot, int block_size) -> ()",
    reference=advance_decode_inputs_reference,
    cuda=lazy_kernel("decode_inputs_kernels", "advance_decode_inputs"),
    fake=_advance_decode_inputs_fake,
)
