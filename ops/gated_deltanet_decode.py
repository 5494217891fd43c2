"""``ce::gated_deltanet_decode``: everything a Gated DeltaNet layer does between in_proj and out_proj at decode.

Why one op: at decode batch 1 the layer's work between its two GEMMs is tiny, and launching it as the unfused ops
(a copy making ``a``/``b`` contiguous, ``ce::causal_conv1d_decode``, ``ce::gated_delta_rule_decode``, the gated
RMSNorm) costs ~5 launches of a few µs each per layer. This op is one launch (ops/triton/gated_deltanet_kernels.py).
The unfused decode ops stay: benchmarks and tests use them, and they are the pieces this op is defined by.

``gated_deltanet_decode(projected [B, P], conv_weight [C, W], conv_state [S, C, W-1], A_log [Hv], dt_bias [Hv],
norm_weight [V], recurrent_state [S, Hv, K, V], state_slots [B], Hk, K, Hv, V, eps) -> [B, Hv*V]``:

* ``projected`` is the in_proj output row of each sequence, ``[q (Hk*K) | k (Hk*K) | v (Hv*V) | z (Hv*V) | b (Hv) |
  a (Hv)]`` (compiled_engine/gated_deltanet.py), so ``P = 2*Hk*K + 2*Hv*V + 2*Hv``; it may have any strides (rows
  of a wider buffer, say: the kernel reads it by offset, no copy). ``C = 2*Hk*K + Hv*V`` (the q|k|v channels).
* Both pools are written in place at the rows ``state_slots``. Padding lanes point at the null slot 0: there
  the recurrent state reads as zeros and is not written (``gated_delta_rule_decode``'s rule: a padding lane
  moves none of its bytes), while the conv history, a few KiB a lane, is read and written as any slot's.
* The result, contiguous in projected's dtype, is by definition the composition of the unfused references with
  their roundings: ``causal_conv1d_decode_reference`` on the q|k|v channels (output in projected's dtype), then
  ``gated_delta_rule_decode_reference`` (output in v's dtype), then the gated ``rms_norm_reference`` with ``z``,
  flattened over the value heads.
"""

from __future__ import annotations

import torch

from ops.conv1d import causal_conv1d_decode_reference
from ops.delta_rule import gated_delta_rule_decode_reference
from ops.layouts import check_gated_deltanet_decode_args, gated_deltanet_split_sizes
from ops.library import define_op
from ops.norm import rms_norm_reference
from ops.triton import HAVE_TRITON

if HAVE_TRITON:  # else the references serve CUDA too (ops/triton/__init__.py)
    from ops.triton import gated_deltanet_kernels


def gated_deltanet_decode_reference(
    projected: torch.Tensor,  # [B, P]: [q | k | v | z | b | a]
    conv_weight: torch.Tensor,  # [C, W]
    conv_state: torch.Tensor,  # [S, C, W-1]  (written at state_slots)
    A_log: torch.Tensor,  # [Hv]
    dt_bias: torch.Tensor,  # [Hv]
    norm_weight: torch.Tensor,  # [V]
    recurrent_state: torch.Tensor,  # [S, Hv, K, V]  (written at state_slots)
    state_slots: torch.Tensor,  # [B] int32
    num_k_heads: int,
    head_k_dim: int,
    num_v_heads: int,
    head_v_dim: int,
    eps: float,
) -> torch.Tensor:
    check_gated_deltanet_decode_args(projected, conv_weight, num_k_heads, head_k_dim, num_v_heads, head_v_dim)
    batch = projected.shape[0]
    sizes = gated_deltanet_split_sizes(num_k_heads, head_k_dim, num_v_heads, head_v_dim)
    key_dim, _, value_dim, _, _, _ = sizes
    mixed_qkv, z, b, a = projected.split([sum(sizes[:3]), *sizes[3:]], dim=-1)
    mixed_qkv = causal_conv1d_decode_reference(mixed_qkv, conv_weight, conv_state, state_slots)
    q, k, v = mixed_qkv.split([key_dim, key_dim, value_dim], dim=-1)
    o = gated_delta_rule_decode_reference(
        q.reshape(batch, num_k_heads, head_k_dim),
        k.reshape(batch, num_k_heads, head_k_dim),
        v.reshape(batch, num_v_heads, head_v_dim),
        a,
        b,
        A_log,
        dt_bias,
        recurrent_state,
        state_slots,
    )
    gate = z.reshape(batch, num_v_heads, head_v_dim)
    return rms_norm_reference(o, norm_weight, gate, eps, zero_centred=False).reshape(batch, num_v_heads * head_v_dim)


def _gated_deltanet_decode_fake(projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, recurrent_state,
                                state_slots, num_k_heads, head_k_dim, num_v_heads, head_v_dim, eps):
    return projected.new_empty((projected.shape[0], num_v_heads * head_v_dim))


gated_deltanet_decode = define_op(
    "gated_deltanet_decode(Tensor projected, Tensor conv_weight, Tensor(a!) conv_state, Tensor A_log, "
    "Tensor dt_bias, Tensor norm_weight, Tensor(b!) recurrent_state, Tensor state_slots, int num_k_heads, "
    "int head_k_dim, int num_v_heads, int head_v_dim, float eps) -> Tensor",
    reference=gated_deltanet_decode_reference,
    cuda=gated_deltanet_kernels.gated_deltanet_decode if HAVE_TRITON else None,
    fake=_gated_deltanet_decode_fake,
)
