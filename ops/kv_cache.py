"""KV store: write the new tokens' keys and values into the paged KV cache of one attention layer.

Cache layout, per attention layer, two separate allocations (one mutated storage each, so Inductor never copies a
shared storage): ``k_cache``, ``v_cache``: ``[num_blocks, block_size, num_kv_heads, head_dim]``.
A token's flat row is ``block_id * block_size + offset`` (``slot_mapping``); padding lanes write to block 0.
"""

from __future__ import annotations

import torch

from ops.library import define_op
from ops.triton import HAVE_TRITON

if HAVE_TRITON:  # else the references serve CUDA too (ops/triton/__init__.py)
    from ops.triton import kv_cache_kernels


def store_kv_reference(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [NB, BS, Hkv, D]  (written)
    v_cache: torch.Tensor,  # [NB, BS, Hkv, D]  (written)
    slot_mapping: torch.Tensor,  # [T] int64
) -> None:
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    rows = slot_mapping.long()
    k_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, rows, key.to(k_cache.dtype))
    v_cache.view(-1, num_kv_heads, head_dim).index_copy_(0, rows, value.to(v_cache.dtype))


def _store_kv_fake(key, value, k_cache, v_cache, slot_mapping) -> None:
    return None


store_kv = define_op(
    "store_kv(Tensor key, Tensor value, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping) -> ()",
    reference=store_kv_reference,
    cuda=kv_cache_kernels.store_kv if HAVE_TRITON else None,
    fake=_store_kv_fake,
)
