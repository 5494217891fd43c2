"""``ce::attention_prologue``: a full-attention layer's work between its qkv projection and paged attention, for
the steps that run attention unfused (prefill, speculative verify, the flash-attn backend).

From the projected rows ``[T, P] = [q_gate | k | v]`` (``q_gate`` per head ``[q_h | gate_h]``): q and k get the
zero-centred RMSNorm over ``head_dim`` (``q_norm_weight``, ``k_norm_weight``) then NeoX partial RoPE at ``positions``;
k and v are stored in the paged cache at ``slot_mapping``; the op returns q ``[T, Hq, D]`` (contiguous). The math and
its roundings are the unfused ops' (``rms_norm_reference`` then ``rotary_reference`` then ``store_kv_reference``),
so the reference is exactly their composition. On CUDA it is one kernel, where the unfused path launched about
twenty (two norms, RoPE's casts, products and concatenations, the store).
"""

from __future__ import annotations

import torch

from ops.kv_cache import store_kv_reference
from ops.library import define_op
from ops.norm import rms_norm_reference
from ops.triton import HAVE_TRITON

if HAVE_TRITON:  # else the references serve CUDA too (ops/triton/__init__.py)
    from ops.triton import attention_prologue_kernels


def rotary_reference(
    positions: torch.Tensor, inv_freq: torch.Tensor, q: torch.Tensor, k: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX (rotate-half) RoPE of q ``[T, Hq, D]`` and k ``[T, Hkv, D]`` at ``positions`` ``[T]`` on the first
    ``rotary_dim = 2 * len(inv_freq)`` channels of each head; the other channels are kept (partial rotary).

    The angles are fp32 (``inv_freq`` is fp32); cos and sin are cast to q's dtype, and the rotation is computed in
    that dtype, as HF's ``apply_rotary_pos_emb`` does.
    """
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos = emb.cos().to(q.dtype)[:, None, :]
    sin = emb.sin().to(q.dtype)[:, None, :]
    return _rotate_half(q, cos, sin), _rotate_half(k, cos, sin)


def _rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    rotary_dim = cos.shape[-1]
    rot, keep = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated_half = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    return torch.cat([rot * cos + rotated_half * sin, keep], dim=-1)


def attention_prologue_reference(
    projected: torch.Tensor,  # [T, P]: [q_gate | k | v]
    q_norm_weight: torch.Tensor,  # [D]
    k_norm_weight: torch.Tensor,  # [D]
    eps: float,
    inv_freq: torch.Tensor,  # [rotary_dim / 2] fp32
    positions: torch.Tensor,  # [T] int64
    k_cache: torch.Tensor,  # [NB, BS, Hkv, D]  (written at slot_mapping)
    v_cache: torch.Tensor,  # [NB, BS, Hkv, D]  (written at slot_mapping)
    slot_mapping: torch.Tensor,  # [T] int64
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
) -> torch.Tensor:
    tokens = projected.shape[0]
    q_gate, k, v = projected.split([2 * num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], -1)
    q = q_gate.reshape(tokens, num_heads, 2 * head_dim)[..., :head_dim]
    q = rms_norm_reference(q, q_norm_weight, None, eps, zero_centred=True)
    k = rms_norm_reference(k.reshape(tokens, num_kv_heads, head_dim), k_norm_weight, None, eps, zero_centred=True)
    q, k = rotary_reference(positions, inv_freq, q, k)
    store_kv_reference(k, v.reshape(tokens, num_kv_heads, head_dim), k_cache, v_cache, slot_mapping)
    return q.contiguous()


def _attention_prologue_fake(projected, q_norm_weight, k_norm_weight, eps, inv_freq, positions, k_cache, v_cache,
                             slot_mapping, num_heads, num_kv_heads, head_dim):
    return projected.new_empty(projected.shape[0], num_heads, head_dim)


attention_prologue = define_op(
    "attention_prologue(Tensor projected, Tensor q_norm_weight, Tensor k_norm_weight, float eps, Tensor inv_freq, "
    "Tensor positions, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping, int num_heads, "
    "int num_kv_heads, int head_dim) -> Tensor",
    reference=attention_prologue_reference,
    cuda=attention_prologue_kernels.attention_prologue if HAVE_TRITON else None,
    fake=_attention_prologue_fake,
)
