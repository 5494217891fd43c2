"""Paged attention over the KV cache (GQA: query head h reads KV head ``h // (Hq // Hkv)``).

* ``paged_attention_decode``: one query per sequence over its ``context_len`` cached tokens (the new token's K/V
  already stored). A padding lane has ``context_len == 0`` and produces zeros.
* ``paged_attention_prefill``: varlen queries; sequence n contributes ``q_len_n`` new tokens whose K/V are already
  stored, at positions ``context_len_n - q_len_n ... context_len_n - 1``; each attends causally to every cached
  token of its sequence (a reused prefix plus the new tokens). This one op serves plain prefill, chunked prefill
  and prefix-cache hits.
* ``paged_attention_verify``: a verify step of speculative decoding, prefill with the same number of new tokens
  (``rows_per_seq``: the last token and its drafts) for every sequence; by definition the prefill op on those
  lengths. Its own op so that the CUDA side may pick a kernel by the step's static shape (a few sequences: each row
  as a decode query over its own prefix, the context split over many programs). With ``gate`` it returns
  ``attn * sigmoid(gate)``, the attention layer's output gate, in the kernels' last pass instead of a kernel of its
  own after them.

The references compute in fp32 and return the query dtype.
"""

from __future__ import annotations

import torch

from ops.layouts import verify_cu_seqlens
from ops.library import define_op
from ops.triton import HAVE_TRITON

if HAVE_TRITON:  # else the references serve CUDA too (ops/triton/__init__.py)
    from ops.triton import paged_attention_kernels


def _gather_sequence_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first ``length`` cached tokens of one sequence: ``[length, Hkv, D]``."""
    block_size = cache.shape[1]
    num_blocks = (length + block_size - 1) // block_size
    blocks = cache[block_table[:num_blocks].long()]  # [nb, BS, Hkv, D]
    return blocks.reshape(-1, cache.shape[2], cache.shape[3])[:length]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor, scale: float):
    """q [Tq, Hq, D] at absolute ``q_positions``; k, v [Tk, Hkv, D] at positions 0..Tk-1. fp32 result."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    key_positions = torch.arange(k.shape[0], device=q.device)
    causal = key_positions[None, :] <= q_positions[:, None]  # [Tq, Tk]
    scores = scores.masked_fill(~causal[None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)


def paged_attention_decode_reference(
    q: torch.Tensor,  # [B, Hq, D]
    k_cache: torch.Tensor,  # [NB, BS, Hkv, D]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B] int32
    scale: float,
) -> torch.Tensor:
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for i, length in enumerate(context_lens.tolist()):
        if length == 0:  # padding lane
            continue
        k = _gather_sequence_kv(k_cache, block_tables[i], length)
        v = _gather_sequence_kv(v_cache, block_tables[i], length)
        position = torch.tensor([length - 1], device=q.device)
        out[i] = _attend(q[i : i + 1], k, v, position, scale)[0]
    return out.to(q.dtype)


def _paged_attention_decode_fake(q, k_cache, v_cache, block_tables, context_lens, scale):
    return q.new_empty(q.shape)  # references return contiguous tensors


paged_attention_decode = define_op(
    "paged_attention_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor context_lens, "
    "float scale) -> Tensor",
    reference=paged_attention_decode_reference,
    cuda=paged_attention_kernels.paged_attention_decode if HAVE_TRITON else None,
    fake=_paged_attention_decode_fake,
)


def paged_attention_prefill_reference(
    q: torch.Tensor,  # [T, Hq, D] new tokens of all sequences, packed
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,  # [N + 1] int32
    context_lens: torch.Tensor,  # [N] int32, cached tokens after this step (prefix + new)
    block_tables: torch.Tensor,  # [N, max_blocks] int32
    scale: float,
) -> torch.Tensor:
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    bounds = cu_seqlens_q.tolist()
    for i, length in enumerate(context_lens.tolist()):
        start, end = bounds[i], bounds[i + 1]
        if end == start:
            continue
        k = _gather_sequence_kv(k_cache, block_tables[i], length)
        v = _gather_sequence_kv(v_cache, block_tables[i], length)
        positions = torch.arange(length - (end - start), length, device=q.device)
        out[start:end] = _attend(q[start:end], k, v, positions, scale)
    return out.to(q.dtype)


def _paged_attention_prefill_fake(q, k_cache, v_cache, cu_seqlens_q, context_lens, block_tables, scale):
    return q.new_empty(q.shape)  # references return contiguous tensors


paged_attention_prefill = define_op(
    "paged_attention_prefill(Tensor q, Tensor k_cache, Tensor v_cache, Tensor cu_seqlens_q, Tensor context_lens, "
    "Tensor block_tables, float scale) -> Tensor",
    reference=paged_attention_prefill_reference,
    cuda=paged_attention_kernels.paged_attention_prefill if HAVE_TRITON else None,
    fake=_paged_attention_prefill_fake,
)


def paged_attention_verify_reference(
    q: torch.Tensor,  # [N * rows_per_seq, Hq, D], sequence by sequence
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    context_lens: torch.Tensor,  # [N] int32, cached tokens after this step
    block_tables: torch.Tensor,  # [N, max_blocks] int32
    rows_per_seq: int,
    scale: float,
    gate: torch.Tensor | None = None,  # [N * rows_per_seq, Hq, D], any strides
) -> torch.Tensor:
    cu_seqlens = verify_cu_seqlens(context_lens.shape[0], rows_per_seq, q.device)
    attn = paged_attention_prefill_reference(q, k_cache, v_cache, cu_seqlens, context_lens, block_tables, scale)
    # the model's unfused gate: the attention output and the sigmoid each in q's dtype, then their product
    return attn if gate is None else attn * torch.sigmoid(gate)


def _paged_attention_verify_fake(q, k_cache, v_cache, context_lens, block_tables, rows_per_seq, scale, gate=None):
    return q.new_empty(q.shape)


paged_attention_verify = define_op(
    "paged_attention_verify(Tensor q, Tensor k_cache, Tensor v_cache, Tensor context_lens, Tensor block_tables, "
    "int rows_per_seq, float scale, Tensor? gate=None) -> Tensor",
    reference=paged_attention_verify_reference,
    cuda=paged_attention_kernels.paged_attention_verify if HAVE_TRITON else None,
    fake=_paged_attention_verify_fake,
)
