"""``ce::attention_decode``: everything a full-attention layer does between qkv_proj and o_proj at decode.

Why one op: at decode batch 1 the layer's work between its two GEMMs is tiny, and the unfused path launches ~7
kernels for it (q_norm, k_norm, rotary, ``ce::store_kv``, the paged attention split and reduce kernels, the sigmoid
gate), each costing a few µs of launch and dependency latency. On CUDA this op is one kernel, plus the paged decode's
reduce kernel when the context is split (ops/triton/attention_decode_kernels.py).
Prefill, and the flash-attn backend, keep the unfused ops, which stay the pieces this op is defined by.

``attention_decode(projected [B, P], q_norm_weight [D], k_norm_weight [D], eps, inv_freq [rotary_dim / 2],
positions [B], k_cache, v_cache, slot_mapping [B], block_tables, context_lens [B], Hq, Hkv, D, scale)
-> [B, Hq*D]``:

* ``projected`` is the qkv_proj output row of each sequence, ``[q_gate (Hq*2*D) | k (Hkv*D) | v (Hkv*D)]``, where
  head h's block of q_gate is ``[q_h (D) | gate_h (D)]``; it may have any strides (rows of a wider buffer, say: the
  kernel reads it by offset, no copy).
* ``k_cache`` / ``v_cache`` ``[num_blocks, block_size, Hkv, D]`` are written at ``slot_mapping`` (the new token's
  K/V); padding lanes (context_len 0) point at the null block and produce zeros.
* The new token is at position ``context_lens[b] - 1``, and ``slot_mapping[b]`` must be that position's cache row
  in ``block_tables[b]`` (as the engine builds them): the CUDA kernel attends to the new token from registers instead
  of reading back the row it writes.
* The result, contiguous in projected's dtype, is by definition the composition the model's unfused path computes,
  with its roundings: ``attention_prologue_reference`` (the zero-centred RMSNorm of q and k over D, RoPE, the K/V
  store: ops/attention_prologue.py), ``paged_attention_decode_reference``, then ``attn * sigmoid(gate)``.
"""

from __future__ import annotations

import torch

from ops.attention_prologue import attention_prologue_reference
from ops.layouts import check_attention_decode_args
from ops.library import define_op
from ops.paged_attention import paged_attention_decode_reference
from ops.triton import HAVE_TRITON

if HAVE_TRITON:  # else the references serve CUDA too (ops/triton/__init__.py)
    from ops.triton import attention_decode_kernels


def attention_decode_reference(
    projected: torch.Tensor,  # [B, P]: [q_gate | k | v]
    q_norm_weight: torch.Tensor,  # [D]
    k_norm_weight: torch.Tensor,  # [D]
    eps: float,
    inv_freq: torch.Tensor,  # [rotary_dim / 2] fp32
    positions: torch.Tensor,  # [B] int64
    k_cache: torch.Tensor,  # [NB, BS, Hkv, D]  (written at slot_mapping)
    v_cache: torch.Tensor,  # [NB, BS, Hkv, D]  (written at slot_mapping)
    slot_mapping: torch.Tensor,  # [B] int64
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    context_lens: torch.Tensor,  # [B] int32, the new token included
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    scale: float,
) -> torch.Tensor:
    check_attention_decode_args(projected, inv_freq, k_cache, num_heads, num_kv_heads, head_dim)
    batch = projected.shape[0]
    q = attention_prologue_reference(projected, q_norm_weight, k_norm_weight, eps, inv_freq, positions, k_cache,
                                     v_cache, slot_mapping, num_heads, num_kv_heads, head_dim)
    gate = projected[:, : 2 * num_heads * head_dim].reshape(batch, num_heads, 2 * head_dim)[..., head_dim:]
    attn = paged_attention_decode_reference(q, k_cache, v_cache, block_tables, context_lens, scale)
    return attn.reshape(batch, -1) * torch.sigmoid(gate.reshape(batch, -1))


def _attention_decode_fake(projected, q_norm_weight, k_norm_weight, eps, inv_freq, positions, k_cache, v_cache,
                           slot_mapping, block_tables, context_lens, num_heads, num_kv_heads, head_dim, scale):
    return projected.new_empty((projected.shape[0], num_heads * head_dim))


attention_decode = define_op(
    "attention_decode(Tensor projected, Tensor q_norm_weight, Tensor k_norm_weight, float eps, Tensor inv_freq, "
    "Tensor positions, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping, Tensor block_tables, "
    "Tensor context_lens, int num_heads, int num_kv_heads, int head_dim, float scale) -> Tensor",
    reference=attention_decode_reference,
    cuda=attention_decode_kernels.attention_decode if HAVE_TRITON else None,
    fake=_attention_decode_fake,
)
