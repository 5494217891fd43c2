"""Triton kernel for ``ce::store_kv``: scatter the new tokens' K and V rows into the paged cache.

One program per token writes that token's ``[Hkv, D]`` key and value rows at its flat cache row
``slot_mapping[t] = block * block_size + offset``. The op is pure data movement, so the kernel's only job is to
touch each byte once; K and V share the program so the slot index is loaded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops.triton import unit_stride


@triton.jit
def _store_kv_kernel(
    key,
    value,
    k_cache,
    v_cache,
    slot_mapping,
    stride_key_t,
    stride_key_h,
    stride_key_d,
    stride_value_t,
    stride_value_h,
    stride_value_d,
    stride_kc_block,
    stride_kc_offset,
    stride_kc_h,
    stride_kc_d,
    stride_vc_block,
    stride_vc_offset,
    stride_vc_h,
    stride_vc_d,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEADS_P: tl.constexpr,
    HEAD_DIM_P: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    # int64 before multiplying by strides: a large cache has more than 2**31 elements.
    row = tl.load(slot_mapping + token).to(tl.int64)
    block = row // BLOCK_SIZE
    offset = row % BLOCK_SIZE

    heads = tl.arange(0, HEADS_P)[:, None]
    dims = tl.arange(0, HEAD_DIM_P)[None, :]
    mask = (heads < NUM_HEADS) & (dims < HEAD_DIM)

    k = tl.load(key + token * stride_key_t + heads * stride_key_h + dims * stride_key_d, mask=mask)
    tl.store(
        k_cache + block * stride_kc_block + offset * stride_kc_offset + heads * stride_kc_h + dims * stride_kc_d,
        k.to(k_cache.dtype.element_ty),
        mask=mask,
    )
    v = tl.load(value + token * stride_value_t + heads * stride_value_h + dims * stride_value_d, mask=mask)
    tl.store(
        v_cache + block * stride_vc_block + offset * stride_vc_offset + heads * stride_vc_h + dims * stride_vc_d,
        v.to(v_cache.dtype.element_ty),
        mask=mask,
    )


def store_kv(
    key: torch.Tensor,  # [T, Hkv, D]
    value: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [NB, BS, Hkv, D]  (written)
    v_cache: torch.Tensor,  # [NB, BS, Hkv, D]  (written)
    slot_mapping: torch.Tensor,  # [T] int64
) -> None:
    num_tokens = key.shape[0]
    if num_tokens == 0:  # a zero-size grid is not a valid launch
        return
    _, block_size, num_heads, head_dim = k_cache.shape
    slot_mapping = unit_stride(slot_mapping)
    _store_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        *key.stride(),
        *value.stride(),
        *k_cache.stride(),
        *v_cache.stride(),
        NUM_HEADS=num_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        HEADS_P=triton.next_power_of_2(num_heads),
        HEAD_DIM_P=triton.next_power_of_2(head_dim),
        num_warps=4 if num_heads * head_dim >= 1024 else 1,
    )
