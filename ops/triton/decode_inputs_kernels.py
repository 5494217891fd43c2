"""Triton kernel for ``ce::advance_decode_inputs`` (ops/decode_inputs.py): one program for the whole batch.

One program, so that the ring slot is read, used and incremented by one program with no race between programs; a
decode batch is at most a few hundred rows, one vector each. A PDL launch (ops/triton/pdl.py): it reads the greedy
tokens ``ce::argmax`` wrote, after ``gdc_wait``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.library import NULL_BLOCK
from ops.triton.pdl import pdl_flags


@triton.jit
def _advance_decode_inputs_kernel(input_ids, positions, slot_mapping, context_lens, block_tables, token_ring,
                                  ring_slot, rows, width, stride_table, ring_slots, stride_ring, block_size,
                                  NULL: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # the tokens are ce::argmax's output
    r = tl.arange(0, BLOCK)
    mask = r < rows
    slot = tl.load(ring_slot)
    tokens = tl.load(input_ids + r, mask=mask)
    tl.store(token_ring + (slot % ring_slots) * stride_ring + r, tokens, mask=mask)
    tl.store(ring_slot, slot + 1)
    context = tl.load(context_lens + r, mask=mask, other=0)
    live = mask & (context > 0)
    position = tl.load(positions + r, mask=live, other=0) + 1
    block_index = position // block_size
    in_table = live & (block_index < width)
    block = tl.load(block_tables + r.to(tl.int64) * stride_table + block_index, mask=in_table, other=NULL)
    tl.store(slot_mapping + r, block.to(tl.int64) * block_size + position % block_size, mask=live)
    tl.store(positions + r, position, mask=live)
    tl.store(context_lens + r, context + 1, mask=live)


def advance_decode_inputs(input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                          context_lens: torch.Tensor, block_tables: torch.Tensor, token_ring: torch.Tensor,
                          ring_slot: torch.Tensor, block_size: int) -> None:
    """``ce::advance_decode_inputs``'s CUDA kernel (also on CPU tensors under ``TRITON_INTERPRET=1``)."""
    rows, width = block_tables.shape
    for name, t in (("input_ids", input_ids), ("positions", positions), ("slot_mapping", slot_mapping),
                    ("context_lens", context_lens)):
        if t.shape != (rows,) or t.stride() != (1,):
            raise ValueError(f"advance_decode_inputs: {name} must be contiguous [{rows}], got {tuple(t.shape)}")
    if block_tables.stride(1) != 1 or token_ring.stride(1) != 1 or token_ring.shape[1] < rows:
        raise ValueError("advance_decode_inputs: block_tables and token_ring need unit column stride, token_ring >= "
                         f"{rows} columns (got {tuple(token_ring.shape)})")
    _advance_decode_inputs_kernel[(1,)](
        input_ids, positions, slot_mapping, context_lens, block_tables, token_ring, ring_slot, rows, width,
        block_tables.stride(0), token_ring.shape[0], token_ring.stride(0), block_size,
        NULL=NULL_BLOCK, BLOCK=max(16, triton.next_power_of_2(rows)), num_warps=4, **pdl_flags(input_ids),
    )
