"""``ce::gated_deltanet_verify`` and ``ce::gated_deltanet_commit``: a Gated DeltaNet layer's verify step of
speculative decoding, and the commit of its accepted prefix.

In a verify step each sequence scores P = k + 1 tokens (its last token and k drafts) at consecutive positions, but
only a prefix of them (known once the target's logits are) may enter the state pools. So the work is split in two:

* ``gated_deltanet_verify(projected [N*P, Pw], conv_weight, conv_state, A_log, dt_bias, norm_weight,
  recurrent_state, state_slots [N], history(a!) [R, Pmax, D], Hk, K, Hv, V, eps) -> [N*P, Hv*V]``: for each
  sequence n (rows ``n*P .. n*P + P - 1`` of ``projected``, the decode op's row layout), runs
  ``ce::gated_deltanet_decode`` P times in a row from its pool state, WITHOUT writing the pools, and returns the
  P outputs. Instead it writes ``history[n, i]`` (ops/layouts.py ``gated_deltanet_history_offsets``): what
  position i adds to the state, i.e. its conv inputs, its normalised keys, the delta rule's update
  ``u = (v - S^T k) * beta`` and decay ``exp(g)`` of every value head. ``R >= N``, ``Pmax >= P``.
* ``gated_deltanet_commit(conv_states(a!)[], recurrent_states(b!)[], state_slots [N], histories [], num_accepted [N]
  int64, Hk, K, Hv, V)``, for every linear layer of the model at once (one list entry a layer, all of one shape:
  one launch instead of one a layer): the pools at ``state_slots`` take the state after position
  ``num_accepted[n]`` (0 .. P - 1) of the last verify: the old conv history shifted by ``num_accepted + 1`` inputs,
  and the recurrent state with ``num_accepted + 1`` updates ``S = S * decay; S += k (x) u`` replayed (rounded to the
  pool's dtype after each, as the decode op stores it). ``num_accepted`` stays on the device: no host sync.

So the state is read once by the verify and read and written once by the commit, where P decode steps would read
and write it P times and keeping every position's state would write it P times more; the history is
``P * D * 4`` bytes a sequence (D ~ 10K at Qwen3.5-0.8B's shape, against a 1 MiB recurrent state per layer).
Padding lanes point at the null slot 0 (their commits race there by design: nobody reads slot 0).

The verify's result, by definition, is P applications of ``gated_deltanet_decode_reference`` on copies of the
sequences' pool rows; the commit's, the pool rows those applications leave after position ``num_accepted``.
"""

from __future__ import annotations

import torch

from ops.conv1d import causal_conv1d_decode_reference
from ops.delta_rule import prepare_inputs
from ops.gated_deltanet_decode import gated_deltanet_decode_reference
from ops.layouts import (
    check_gated_deltanet_verify_args, gated_deltanet_history_offsets, gated_deltanet_split_sizes,
)
from ops.library import define_op
from ops.triton import HAVE_TRITON

if HAVE_TRITON:  # else the references serve CUDA too (ops/triton/__init__.py)
    from ops.triton import gated_deltanet_kernels


def gated_deltanet_verify_reference(
    projected: torch.Tensor,  # [N*P, Pw]: [q | k | v | z | b | a], sequence by sequence
    conv_weight: torch.Tensor,  # [C, W]
    conv_state: torch.Tensor,  # [S, C, W-1]  (read only)
    A_log: torch.Tensor,  # [Hv]
    dt_bias: torch.Tensor,  # [Hv]
    norm_weight: torch.Tensor,  # [V]
    recurrent_state: torch.Tensor,  # [S, Hv, K, V]  (read only)
    state_slots: torch.Tensor,  # [N] int32
    history: torch.Tensor,  # [R, Pmax, D] fp32  (written at [:N, :P])
    num_k_heads: int,
    head_k_dim: int,
    num_v_heads: int,
    head_v_dim: int,
    eps: float,
) -> torch.Tensor:
    positions = check_gated_deltanet_verify_args(projected, conv_weight, state_slots, history, num_k_heads,
                                                 head_k_dim, num_v_heads, head_v_dim)
    n = state_slots.shape[0]
    key_dim, _, value_dim, _, _, _ = sizes = gated_deltanet_split_sizes(num_k_heads, head_k_dim, num_v_heads,
                                                                        head_v_dim)
    channels = sum(sizes[:3])
    keys_at, updates_at, decays_at, _ = gated_deltanet_history_offsets(num_k_heads, head_k_dim, num_v_heads,
                                                                       head_v_dim)
    slots = state_slots.long()
    # Copies of the sequences' pool rows (the pools stay as they are), as rows 1..n of scratch pools: row 0 is the
    # null slot, which the decode reference treats as a padding lane's (a zero recurrent state, never written).
    conv = torch.cat([conv_state[:1], conv_state[slots]])
    recurrent = torch.cat([recurrent_state[:1], recurrent_state[slots]])
    rows = torch.arange(1, n + 1, dtype=torch.int32, device=projected.device)
    per_position = projected.view(n, positions, -1)
    outputs = []
    for i in range(positions):
        x = per_position[:, i]
        # What position i adds to the state, computed as the decode reference computes it (before it moves on).
        mixed_qkv, _, b, a = x.split([channels, *sizes[3:]], dim=-1)
        q, k, v = causal_conv1d_decode_reference(mixed_qkv, conv_weight, conv.clone(), rows).split(
            [key_dim, key_dim, value_dim], dim=-1)
        _, kn, g, beta = prepare_inputs(q.reshape(n, num_k_heads, head_k_dim), k.reshape(n, num_k_heads, head_k_dim),
                                        a, b, A_log, dt_bias, num_v_heads)
        s = recurrent[1:].float() * g.exp()[:, :, None, None]
        u = (v.reshape(n, num_v_heads, head_v_dim).float() - torch.einsum("bhkv,bhk->bhv", s, kn)) * beta[:, :, None]
        group = num_v_heads // num_k_heads
        history[:n, i, :channels] = mixed_qkv.to(conv_state.dtype).float()
        history[:n, i, keys_at:updates_at] = kn[:, ::group].reshape(n, -1)
        history[:n, i, updates_at:decays_at] = u.reshape(n, -1)
        history[:n, i, decays_at:] = g.exp()
        outputs.append(gated_deltanet_decode_reference(x, conv_weight, conv, A_log, dt_bias, norm_weight, recurrent,
                                                       rows, num_k_heads, head_k_dim, num_v_heads, head_v_dim, eps))
    return torch.stack(outputs, dim=1).reshape(n * positions, num_v_heads * head_v_dim)


def _gated_deltanet_verify_fake(projected, conv_weight, conv_state, A_log, dt_bias, norm_weight, recurrent_state,
                                state_slots, history, num_k_heads, head_k_dim, num_v_heads, head_v_dim, eps):
    return projected.new_empty((projected.shape[0], num_v_heads * head_v_dim))


gated_deltanet_verify = define_op(
    "gated_deltanet_verify(Tensor projected, Tensor conv_weight, Tensor conv_state, Tensor A_log, Tensor dt_bias, "
    "Tensor norm_weight, Tensor recurrent_state, Tensor state_slots, Tensor(a!) history, int num_k_heads, "
    "int head_k_dim, int num_v_heads, int head_v_dim, float eps) -> Tensor",
    reference=gated_deltanet_verify_reference,
    cuda=gated_deltanet_kernels.gated_deltanet_verify if HAVE_TRITON else None,
    fake=_gated_deltanet_verify_fake,
)


def gated_deltanet_commit_reference(
    conv_states: list[torch.Tensor],  # per layer [S, C, W-1]  (written at state_slots)
    recurrent_states: list[torch.Tensor],  # per layer [S, Hv, K, V]  (written at state_slots)
    state_slots: torch.Tensor,  # [N] int32
    histories: list[torch.Tensor],  # per layer [R, Pmax, D] fp32: the last verify's
    num_accepted: torch.Tensor,  # [N] int64: positions 0..num_accepted of the last verify are committed
    num_k_heads: int,
    head_k_dim: int,
    num_v_heads: int,
    head_v_dim: int,
) -> None:
    if not len(conv_states) == len(recurrent_states) == len(histories):
        raise ValueError("gated_deltanet_commit: one conv state, recurrent state and history per layer")
    for conv_state, recurrent_state, history in zip(conv_states, recurrent_states, histories):
        _commit_layer(conv_state, recurrent_state, state_slots, history, num_accepted, num_k_heads, head_k_dim,
                      num_v_heads, head_v_dim)


def _commit_layer(conv_state, recurrent_state, state_slots, history, num_accepted, num_k_heads, head_k_dim,
                  num_v_heads, head_v_dim) -> None:
    n = state_slots.shape[0]
    slots = state_slots.long()
    keys_at, updates_at, decays_at, _ = gated_deltanet_history_offsets(num_k_heads, head_k_dim, num_v_heads,
                                                                       head_v_dim)
    entries = history[:n]  # [N, Pmax, D]
    # Conv: the window [old history | x_0 .. x_Pmax-1] seen from input num_accepted + 1 on, W - 1 inputs wide.
    keep = conv_state.shape[2]
    window = torch.cat([conv_state[slots], entries[:, :, :keys_at].transpose(1, 2).to(conv_state.dtype)], dim=2)
    columns = num_accepted[:, None] + 1 + torch.arange(keep, device=num_accepted.device)
    conv_state.index_copy_(0, slots, window.gather(2, columns[:, None, :].expand(-1, window.shape[1], -1)))
    # Recurrent: the decode reference's update (S *= exp(g); S += k (x) u; stored in the pool's dtype) per position.
    group = num_v_heads // num_k_heads
    s = recurrent_state[slots]
    for i in range(history.shape[1]):
        kn = entries[:, i, keys_at:updates_at].reshape(n, num_k_heads, head_k_dim).repeat_interleave(group, dim=1)
        u = entries[:, i, updates_at:decays_at].reshape(n, num_v_heads, head_v_dim)
        step = s.float() * entries[:, i, decays_at:][:, :, None, None]
        step = (step + kn[:, :, :, None] * u[:, :, None, :]).to(recurrent_state.dtype)
        s = torch.where((num_accepted >= i)[:, None, None, None], step, s)
    recurrent_state.index_copy_(0, slots, s)


def _gated_deltanet_commit_fake(conv_states, recurrent_states, state_slots, histories, num_accepted, num_k_heads,
                                head_k_dim, num_v_heads, head_v_dim) -> None:
    return None


gated_deltanet_commit = define_op(
    "gated_deltanet_commit(Tensor(a!)[] conv_states, Tensor(b!)[] recurrent_states, Tensor state_slots, "
    "Tensor[] histories, Tensor num_accepted, int num_k_heads, int head_k_dim, int num_v_heads, int head_v_dim) -> ()",
    reference=gated_deltanet_commit_reference,
    cuda=gated_deltanet_kernels.gated_deltanet_commit if HAVE_TRITON else None,
    fake=_gated_deltanet_commit_fake,
)
