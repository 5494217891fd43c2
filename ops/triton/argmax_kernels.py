"""Triton kernels for ``ce::argmax``: the first index of each row's maximum (NaN the largest), in two launches.

Why two: one row of a decode step's logits is the whole vocabulary (248,320 for Qwen3.5), far too long for one
program to read quickly, so the row is cut into CHUNK-wide pieces read in parallel:
  1. grid ``(B, cdiv(V, CHUNK))``: each program finds its chunk's winner and writes (value, index) to a partials
     buffer ``[B, chunks]``;
  2. grid ``(B,)``: each program reads its row's partials and picks the winner among them.
The winner of a set of (value, index) pairs, as torch.argmax defines it: if any value is NaN, the NaN with the
smallest index; otherwise the smallest index among the values equal to the maximum. A chunk's winner carries its
value (NaN included) and its global index, and the chunks of a row are in index order, so applying the same rule to
the chunk winners gives the row's winner. Values are compared in fp32 (exact for bf16 and fp16 logits).

Both kernels are PDL launches (ops/triton/pdl.py): they read only what the kernels before them wrote, after
``gdc_wait``, and let the next kernel start early.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.triton.pdl import pdl_flags

CHUNK = 4096  # logits per program of the first pass: 61 programs a row at V = 248,320
MAX_CHUNKS = 1024  # the second pass reads all of a row's chunk winners at once: V up to 4M


@triton.jit
def _winner(values, indices, mask, AXIS: tl.constexpr = 0):
    """(value, index) of torch.argmax's winner among the masked lanes along ``AXIS``: the first NaN if any, else the
    first max."""
    big = 2147483647
    is_nan = (values != values) & mask
    first_nan = tl.min(tl.where(is_nan, indices, big), AXIS)
    best = tl.max(tl.where(mask & ~is_nan, values, float("-inf")), AXIS)
    first_best = tl.min(tl.where(mask & (values == tl.expand_dims(best, AXIS)), indices, big), AXIS)
    any_nan = first_nan < big
    index = tl.where(any_nan, first_nan, first_best)
    value = tl.where(any_nan, float("nan"), best)
    # Values of -inf only: best is -inf, every live lane equals it, and the first wins (as in torch). Every chunk
    # has a live lane (the grid is cdiv(V, CHUNK)).
    return value, index


@triton.jit
def _argmax_chunks_kernel(logits, part_value, part_index, V, stride_row, num_chunks,
                          CHUNK: tl.constexpr, USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # the logits are the previous kernel's output
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < V
    values = tl.load(logits + row * stride_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
    value, index = _winner(values, offs, mask)
    tl.store(part_value + row * num_chunks + chunk, value)
    tl.store(part_index + row * num_chunks + chunk, index)


@triton.jit
def _row_winner(part_value, part_index, row, num_chunks, CHUNKS_P: tl.constexpr):
    """The index torch.argmax picks for ``row``, from its chunks' winners (``part_value``/``part_index``
    ``[rows, num_chunks]``)."""
    offs = tl.arange(0, CHUNKS_P)
    mask = offs < num_chunks
    values = tl.load(part_value + row * num_chunks + offs, mask=mask, other=float("-inf"))
    indices = tl.load(part_index + row * num_chunks + offs, mask=mask, other=0)
    _, index = _winner(values, indices, mask)
    return index


@triton.jit
def _argmax_rows_kernel(part_value, part_index, out, num_chunks, CHUNKS_P: tl.constexpr, USE_PDL: tl.constexpr):
    if USE_PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    tl.store(out + row, _row_winner(part_value, part_index, row, num_chunks, CHUNKS_P).to(tl.int64))


def argmax(logits: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """``ce::argmax``'s CUDA kernel (also on CPU tensors under ``TRITON_INTERPRET=1``); ``chunk`` (a power of two)
    overrides the first pass's width (the tests use small ones to get several chunks from short rows)."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"argmax: logits must be [B, V] with contiguous columns, got {tuple(logits.shape)} "
                         f"strides {logits.stride()}")
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.long, device=logits.device)
    if rows == 0:
        return out
    if vocab == 0:
        raise ValueError("argmax: an empty row has no maximum")  # torch.argmax raises too
    num_chunks = triton.cdiv(vocab, chunk)
    if num_chunks > MAX_CHUNKS:
        raise ValueError(f"argmax: {vocab} logits need {num_chunks} chunks of {chunk}, more than {MAX_CHUNKS}")
    part_value = torch.empty(rows, num_chunks, dtype=torch.float32, device=logits.device)
    part_index = torch.empty(rows, num_chunks, dtype=torch.int32, device=logits.device)
    flags = pdl_flags(logits)
    _argmax_chunks_kernel[(rows, num_chunks)](logits, part_value, part_index, vocab, logits.stride(0), num_chunks,
                                              CHUNK=chunk, num_warps=4, **flags)
    _argmax_rows_kernel[(rows,)](part_value, part_index, out, num_chunks,
                                 CHUNKS_P=max(16, triton.next_power_of_2(num_chunks)), num_warps=4, **flags)
    return out
