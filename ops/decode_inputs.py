"""``ce::advance_decode_inputs``: the decode graph's last op picks each row's greedy token and turns the step's
inputs into the next step's.

Why: at batch 1 the step's copies between two decode graphs (the inputs' host -> device copy and the greedy tokens'
device -> host copy) cost the GPU several times their transfer time, in launches and the gaps around them
(bench/NOTES.md, "Decode epilogue"). In the steady state the next step is predictable: the same sequences, one position
further, their greedy tokens as input ids. So the graph writes that prediction itself, and the host copies inputs only
where its step differs from it (graphs/static_inputs.py); and the graph writes the tokens straight into host memory, a
row of a small ring the host reads once the graph is done, instead of a copy after the graph. The greedy token is
computed here too (ce::argmax's rule and first pass), so the whole epilogue is two short kernels.

``ce::advance_decode_inputs(logits [B, V], input_ids [B]!, positions [B]!, slot_mapping [B]!, context_lens [B]!,
block_tables [B, W], token_ring [K, >= B]!, ring_slot [1]!, block_size, tokens [B]?) -> tokens [B]`` int64:
  * the step's tokens: ``tokens`` when given (a sampled step: the decode graph's ``ce::sample``), else each row's
    greedy token, torch.argmax's rule (ops/argmax.py); written to ``input_ids`` and to
    ``token_ring[ring_slot % K, :B]``, then ``ring_slot += 1``;
  * for every live row (``context_lens > 0``; padding lanes are left as they are): ``positions += 1``,
    ``context_lens += 1``, ``slot_mapping`` = the KV row of the new position in the row's block table (the null
    block's when the table does not reach it yet: the host, which reserves that block, then copies the step in).
"""

from __future__ import annotations

import torch

from ops.argmax import argmax_reference
from ops.library import NULL_BLOCK, define_op
from ops.triton import HAVE_TRITON

if HAVE_TRITON:  # else the references serve CUDA too (ops/triton/__init__.py)
    from ops.triton import decode_inputs_kernels


def advance_decode_inputs_reference(
    logits: torch.Tensor,  # [B, V]: the step's logits
    input_ids: torch.Tensor,  # [B] int64 (written: the greedy tokens)
    positions: torch.Tensor,  # [B] int64 (written)
    slot_mapping: torch.Tensor,  # [B] int64 (written)
    context_lens: torch.Tensor,  # [B] int32 (written)
    block_tables: torch.Tensor,  # [B, W] int32
    token_ring: torch.Tensor,  # [K, R >= B] int64 (written): host-visible memory on a GPU
    ring_slot: torch.Tensor,  # [1] int64 (written)
    block_size: int,
    tokens: torch.Tensor | None = None,  # [B] int64: the step's tokens when chosen elsewhere (sampled)
) -> torch.Tensor:
    rows, width = block_tables.shape
    tokens = argmax_reference(logits) if tokens is None else tokens.clone()
    input_ids.copy_(tokens)
    token_ring[int(ring_slot[0]) % token_ring.shape[0], :rows] = tokens
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
    return tokens


def _advance_decode_inputs_fake(logits, input_ids, positions, slot_mapping, context_lens, block_tables, token_ring,
                                ring_slot, block_size, tokens=None) -> torch.Tensor:
    return logits.new_empty((logits.shape[0],), dtype=torch.long)


advance_decode_inputs = define_op(
    "advance_decode_inputs(Tensor logits, Tensor(a!) input_ids, Tensor(b!) positions, Tensor(c!) slot_mapping, "
    "Tensor(d!) context_lens, Tensor block_tables, Tensor(e!) token_ring, Tensor(f!) ring_slot, int block_size, "
    "Tensor? tokens=None) -> Tensor",
    reference=advance_decode_inputs_reference,
    cuda=decode_inputs_kernels.advance_decode_inputs if HAVE_TRITON else None,
    fake=_advance_decode_inputs_fake,
)
