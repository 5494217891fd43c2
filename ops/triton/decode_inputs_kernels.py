"""Triton kernels for ``ce::advance_decode_inputs`` (ops/decode_inputs.py): ce::argmax's first pass, then one
program that picks every row's token and writes the next step's inputs.

The second kernel is one program for the whole batch, so that the ring slot is read, used and incremented by one
program, with no race between programs; a decode batch is at most a few hundred rows, taken ROW_BLOCK at a time.
Both are PDL launches (ops/triton/pdl.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.library import NULL_BLOCK
from ops.triton.argmax_kernels import CHUNK, MAX_CHUNKS, _argmax_chunks_kernel, _winner
from ops.triton.pdl import pdl_flags

ROW_BLOCK = 16  # rows per iteration of the second kernel


@triton.jit
def _next_decode_inputs_kernel(part_value, part_index, num_chunks, tokens, input_ids, positions, slot_mapping,
                               context_lens, block_tables, token_ring, ring_slot, rows, width, stride_table,
                               ring_slots, stride_ring, block_size, NULL: tl.constexpr, ROW_BLOCK: tl.constexpr,
                               CHUNKS_P: tl.constexpr, GIVEN: tl.constexpr, USE_PDL: tl.constexpr):
    """GIVEN: ``tokens`` holds the step's tokens (read); else the chunk winners are reduced into it (written)."""
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # the chunk winners (or the given tokens) are the previous kernel's output
    slot = tl.load(ring_slot)
    ring_row = token_ring + (slot % ring_slots) * stride_ring
    chunks = tl.arange(0, CHUNKS_P)
    for first in range(0, rows, ROW_BLOCK):
        r = first + tl.arange(0, ROW_BLOCK)
        row_mask = r < rows
        if GIVEN:
            token = tl.load(tokens + r, mask=row_mask, other=0)
        else:
            mask = row_mask[:, None] & (chunks < num_chunks)[None, :]
            offsets = r[:, None] * num_chunks + chunks[None, :]
            values = tl.load(part_value + offsets, mask=mask, other=float("-inf"))
            indices = tl.load(part_index + offsets, mask=mask, other=0)
            _, token = _winner(values, indices, mask, 1)
            token = token.to(tl.int64)
            tl.store(tokens + r, token, mask=row_mask)
        tl.store(input_ids + r, token, mask=row_mask)
        tl.store(ring_row + r, token, mask=row_mask)
        context = tl.load(context_lens + r, mask=row_mask, other=0)
        live = row_mask & (context > 0)
        position = tl.load(positions + r, mask=live, other=0) + 1
        block_index = position // block_size
        in_table = live & (block_index < width)
        block = tl.load(block_tables + r.to(tl.int64) * stride_table + block_index, mask=in_table, other=NULL)
        tl.store(slot_mapping + r, block.to(tl.int64) * block_size + position % block_size, mask=live)
        tl.store(positions + r, position, mask=live)
        tl.store(context_lens + r, context + 1, mask=live)
    tl.store(ring_slot, slot + 1)


def advance_decode_inputs(logits: torch.Tensor, input_ids: torch.Tensor, positions: torch.Tensor,
                          slot_mapping: torch.Tensor, context_lens: torch.Tensor, block_tables: torch.Tensor,
                          token_ring: torch.Tensor, ring_slot: torch.Tensor, block_size: int,
                          tokens: torch.Tensor | None = None, chunk: int = CHUNK) -> torch.Tensor:
    """``ce::advance_decode_inputs``'s CUDA kernels (also on CPU tensors under ``TRITON_INTERPRET=1``): with
    ``tokens`` (a sampled step) only the second, which takes them instead of the greedy tokens. ``chunk``
    overrides the first pass's width (tests: several chunks from short rows)."""
    rows, width = block_tables.shape
    if logits.dim() != 2 or logits.shape[0] != rows or logits.stride(1) != 1 or logits.shape[1] == 0:
        raise ValueError(f"advance_decode_inputs: logits must be [{rows}, V > 0] with contiguous columns, got "
                         f"{tuple(logits.shape)} strides {logits.stride()}")
    for name, t in (("input_ids", input_ids), ("positions", positions), ("slot_mapping", slot_mapping),
                    ("context_lens", context_lens)):
        if t.shape != (rows,) or t.stride() != (1,):
            raise ValueError(f"advance_decode_inputs: {name} must be contiguous [{rows}], got {tuple(t.shape)}")
    if block_tables.stride(1) != 1 or token_ring.stride(1) != 1 or token_ring.shape[1] < rows:
        raise ValueError("advance_decode_inputs: block_tables and token_ring need unit column stride, token_ring >= "
                         f"{rows} columns (got {tuple(token_ring.shape)})")
    vocab = logits.shape[1]
    num_chunks = triton.cdiv(vocab, chunk)
    if num_chunks > MAX_CHUNKS:
        raise ValueError(f"advance_decode_inputs: {vocab} logits need {num_chunks} chunks, more than {MAX_CHUNKS}")
    flags = pdl_flags(logits)
    given = tokens is not None
    if given:
        if tokens.shape != (rows,) or tokens.dtype != torch.long or tokens.stride() != (1,):
            raise ValueError(f"advance_decode_inputs: tokens must be contiguous [{rows}] int64, got "
                             f"{tuple(tokens.shape)} {tokens.dtype}")
        out = tokens.clone()  # the op's output is a tensor of its own, as the reference's
        part_value = part_index = out  # unread
    else:
        out = torch.empty(rows, dtype=torch.long, device=logits.device)
        part_value = torch.empty(rows, num_chunks, dtype=torch.float32, device=logits.device)
        part_index = torch.empty(rows, num_chunks, dtype=torch.int32, device=logits.device)
        if rows:
            _argmax_chunks_kernel[(rows, num_chunks)](logits, part_value, part_index, vocab, logits.stride(0),
                                                      num_chunks, CHUNK=chunk, num_warps=4, **flags)
    _next_decode_inputs_kernel[(1,)](
        part_value, part_index, num_chunks, out, input_ids, positions, slot_mapping, context_lens, block_tables,
        token_ring, ring_slot, rows, width, block_tables.stride(0), token_ring.shape[0], token_ring.stride(0),
        block_size, NULL=NULL_BLOCK, ROW_BLOCK=ROW_BLOCK, CHUNKS_P=max(16, triton.next_power_of_2(num_chunks)),
        GIVEN=given, num_warps=4, **flags,
    )
    return out
