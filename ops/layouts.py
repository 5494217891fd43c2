"""Argument layouts that an op's reference (ops/<family>.py) and its kernel (ops/triton/<family>_kernels.py) share.

Below both: op modules import kernel modules, never the reverse (ops/triton/__init__.py), so what both need lives
here, in plain Python (no triton: the references run where triton is absent). It imports nothing from ops.

* ``ce::attention_decode``'s ``projected`` row: ``[q_gate (Hq*2*D) | k (Hkv*D) | v (Hkv*D)]``;
* ``ce::gated_deltanet_decode``'s ``projected`` row: ``[q (Hk*K) | k (Hk*K) | v (Hv*V) | z (Hv*V) | b (Hv) | a (Hv)]``;
* FLA's chunk length, which the chunked delta-rule reference, the host chunk table and FLA's kernels all use;
* ``ce::sample``'s number formats: the integer key of a logit, the fixed-point token mass, the cut-offs.
"""

from __future__ import annotations

import torch

CHUNK_SIZE = 64  # FLA's chunk length; prefix-cache snapshot boundaries are multiples of it


def attention_decode_split_sizes(num_heads: int, num_kv_heads: int, head_dim: int) -> list[int]:
    """Widths of ``ce::attention_decode``'s ``projected`` blocks ``[q_gate | k | v]``."""
    return [2 * num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]


def check_attention_decode_args(projected, inv_freq, k_cache, num_heads, num_kv_heads, head_dim) -> None:
    """``ce::attention_decode``'s argument checks, shared by the reference and the kernel."""
    width = sum(attention_decode_split_sizes(num_heads, num_kv_heads, head_dim))
    if projected.dim() != 2 or projected.shape[1] != width:
        raise ValueError(f"attention_decode: projected must be [B, {width}] ([q_gate | k | v]), "
                         f"got {tuple(projected.shape)}")
    if num_heads % num_kv_heads:
        raise ValueError(f"attention_decode: {num_heads=} is not a multiple of {num_kv_heads=}")
    if inv_freq.dim() != 1 or not 0 < 2 * inv_freq.shape[0] <= head_dim:
        raise ValueError(f"attention_decode: inv_freq must be [rotary_dim / 2] with rotary_dim <= {head_dim=}, "
                         f"got {tuple(inv_freq.shape)}")
    if k_cache.dim() != 4 or tuple(k_cache.shape[2:]) != (num_kv_heads, head_dim):
        raise ValueError(f"attention_decode: the caches must be [num_blocks, block_size, {num_kv_heads}, {head_dim}], "
                         f"got {tuple(k_cache.shape)}")


def gated_deltanet_split_sizes(num_k_heads: int, head_k_dim: int, num_v_heads: int,
                               head_v_dim: int) -> list[int]:
    """Widths of ``ce::gated_deltanet_decode``'s ``projected`` blocks ``[q | k | v | z | b | a]``."""
    key_dim, value_dim = num_k_heads * head_k_dim, num_v_heads * head_v_dim
    return [key_dim, key_dim, value_dim, value_dim, num_v_heads, num_v_heads]


def check_gated_deltanet_decode_args(projected, conv_weight, num_k_heads, head_k_dim, num_v_heads,
                                     head_v_dim) -> None:
    """``ce::gated_deltanet_decode``'s argument checks, shared by the reference and the kernel."""
    sizes = gated_deltanet_split_sizes(num_k_heads, head_k_dim, num_v_heads, head_v_dim)
    if projected.dim() != 2 or projected.shape[1] != sum(sizes):
        raise ValueError(f"gated_deltanet_decode: projected must be [B, {sum(sizes)}] ([q | k | v | z | b | a]), "
                         f"got {tuple(projected.shape)}")
    if num_v_heads % num_k_heads:
        raise ValueError(f"gated_deltanet_decode: {num_v_heads=} is not a multiple of {num_k_heads=}")
    if conv_weight.dim() != 2 or conv_weight.shape[0] != sum(sizes[:3]):
        raise ValueError(f"gated_deltanet_decode: conv_weight must be [{sum(sizes[:3])}, W], "
                         f"got {tuple(conv_weight.shape)}")


# ce::sample (ops/sample.py)
KEY_SHIFT = {torch.float32: 0, torch.float16: 13, torch.bfloat16: 16}  # low key bits that are constant per dtype
MIN_TEMPERATURE = 2.0**-100  # temperatures below it count as it: 1 / T stays finite
MASS_SCALE = 2.0**32  # W = trunc(exp_ce(y) * 2**32): the fixed-point weight of a token in the top-p masses
EXP_CUTOFF = -80.0  # exp_ce(y) = 0 below it
