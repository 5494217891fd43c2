"""Gated delta rule (the Gated DeltaNet recurrence), with the recurrent state kept in a pool indexed by slot.

Inputs are the raw post-conv projections; the ops apply, in fp32 (docs/ARCHITECTURE.md, "Model math"):
  q, k <- l2norm(q), l2norm(k)  with ``x * rsqrt(sum(x^2) + 1e-6)``;  q <- q * K**-0.5
  value head j reads key head ``j // (Hv // Hk)``  (repeat_interleave, not tile)
  g    = -exp(A_log) * softplus(a + dt_bias)      beta = sigmoid(b)
  per token, state S [Hv, K, V]:  S *= exp(g);  u = (v - S^T k) * beta;  S += k (x) u;  o = S^T q

* ``gated_delta_rule_prefill``: varlen tokens packed by ``cu_seqlens``; sequence n starts from
  ``state[state_slots[n]]`` (zeroed when the slot was allocated) and its final state is written back there. A
  sequence at the null slot (a captured step's padding) starts from a zero state and writes none back, as decode's
  padding lanes.
  The reference is the chunked (WY) form with 64-token chunks, the same function FLA's chunk kernel computes.
  Two optional arguments change nothing in the result; they spare the CUDA kernel (FLA) host work per call:
  ``cu_seqlens_long``, the same offsets as int64, and ``chunk_indices`` (:func:`host_chunk_indices`), FLA's table
  of 64-token chunks computed on the host. Without the table FLA derives it on the device with a host sync; FLA also
  memoises what it derives from ``cu_seqlens`` on the identity (``is``) of the int64 tensor it gets, so every layer
  of a step should pass the same ``cu_seqlens_long`` object, and nobody may refill one in place (pack_step makes a
  new one per step). Without ``cu_seqlens_long`` the kernel hands FLA a fresh int64 copy per call (never stale,
  never memoised). The table may end with skip rows (``host_chunk_indices(..., num_rows=)``): a captured step's
  table has one length for every step of its shape, and FLA's kernels pass over a chunk past its sequence's end.
  The reference checks that both equal what they summarise. ``graphed`` (a captured step: launches cost nothing)
  changes nothing in the result either: the CUDA kernel then takes the form of least GPU time.
* ``gated_delta_rule_decode``: one token per sequence, reading and writing ``state`` in place by slot. A lane at
  the null slot (``ops.library.NULL_SLOT``) is a padding lane of a bucketed batch: its state reads as zeros and is
  not written back, so padding moves none of the state's bytes (1 MiB a lane and layer at Qwen3.5-0.8B's shape).

The pool is fp32 by default (bf16 allowed); outputs have v's dtype.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ops.layouts import CHUNK_SIZE
from ops.library import NULL_SLOT, define_op
from ops.triton import HAVE_TRITON

if HAVE_TRITON:  # else the references serve CUDA too (ops/triton/__init__.py)
    from ops.triton import delta_rule_kernels

L2NORM_EPS = 1e-6


def host_chunk_indices(
    cu_seqlens: Sequence[int], chunk_size: int = CHUNK_SIZE, num_rows: int | None = None
) -> list[int]:
    """FLA's varlen chunk table from host offsets, flattened: ``(sequence n, chunk c of it)`` for every
    ``chunk_size``-token chunk of every sequence, in order (a sequence of length 0 has none). As a ``[num_chunks, 2]``
    int64 tensor it equals ``fla.ops.utils.index.prepare_chunk_indices(cu_seqlens, chunk_size)``, which on a device
    costs ~12 small launches and a host sync (``repeat_interleave`` reads its output size).

    ``num_rows``: the table padded to that many rows with skip rows, each the chunk just past the last sequence's
    end: a captured step's table has one length whatever its sequences' lengths. FLA's kernels mask a chunk's loads
    and stores to its sequence's tokens (the fused intra-chunk kernel returns first), so a skip row reads and writes
    no token; the state kernel walks each sequence's own chunks. ``max_chunk_rows(tokens, sequences)`` rows hold any
    step of that shape."""
    rows = [
        v
        for n, (start, end) in enumerate(zip(cu_seqlens[:-1], cu_seqlens[1:]))
        for c in range(-(-(end - start) // chunk_size))
        for v in (n, c)
    ]
    if num_rows is not None and num_rows * 2 != len(rows):
        if num_rows * 2 < len(rows) or len(cu_seqlens) < 2:
            raise ValueError(f"num_rows={num_rows}: the table of {len(cu_seqlens) - 1} sequences has {len(rows) // 2} "
                             "rows")
        last = len(cu_seqlens) - 2
        skip = (last, -(-(cu_seqlens[-1] - cu_seqlens[-2]) // chunk_size))
        rows += skip * (num_rows - len(rows) // 2)
    return rows


def max_chunk_rows(num_tokens: int, num_sequences: int, chunk_size: int = CHUNK_SIZE) -> int:
    """The most chunks ``num_sequences`` sequences of ``num_tokens`` tokens in all can have: each sequence's last
    chunk may be partial, so at most one chunk more per sequence after the first."""
    return -(-num_tokens // chunk_size) + max(num_sequences - 1, 0)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def prepare_inputs(q, k, a, b, A_log, dt_bias, num_value_heads: int):
    """Normalised, scaled, head-expanded q and k, and the gates g and beta, all fp32.

    q, k [..., Hk, K] -> [..., Hv, K];  a, b [..., Hv] -> g, beta [..., Hv].
    """
    group = num_value_heads // q.shape[-2]
    q = l2norm(q) * (q.shape[-1] ** -0.5)
    k = l2norm(k)
    q = q.repeat_interleave(group, dim=-2)
    k = k.repeat_interleave(group, dim=-2)
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    beta = b.float().sigmoid()
    return q, k, g, beta


def recurrent_reference(q, k, v, g, beta, state):
    """Token-by-token recurrence for one sequence (prepared inputs, fp32).

    q, k [L, H, K]; v [L, H, V]; g, beta [L, H]; state [H, K, V] -> (o [L, H, V], final state).
    """
    state = state.clone()
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for t in range(v.shape[0]):
        state = state * g[t].exp()[:, None, None]
        u = (v[t] - torch.einsum("hkv,hk->hv", state, k[t])) * beta[t][:, None]
        state = state + k[t][:, :, None] * u[:, None, :]
        out[t] = torch.einsum("hkv,hk->hv", state, q[t])
    return out, state


def chunked_reference(q, k, v, g, beta, state, chunk_size: int = CHUNK_SIZE):
    """The same function as ``recurrent_reference``, computed chunk by chunk (WY form).

    Within a chunk with cumulative log-decay G_t = g_1 + ... + g_t and initial state S0:
      (I + A) U = beta * (V - exp(G) * K S0),  A[t, j] = beta_t exp(G_t - G_j) k_t.k_j  (j < t)
      o_t = exp(G_t) S0^T q_t + sum_{j<=t} exp(G_t - G_j) (q_t.k_j) u_j
      S_L = exp(G_L) S0 + sum_j exp(G_L - G_j) k_j u_j^T
    """
    state = state.clone().float()
    v = v.float()
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for start in range(0, v.shape[0], chunk_size):
        end = min(start + chunk_size, v.shape[0])
        qc, kc, vc = (x[start:end].transpose(0, 1) for x in (q, k, v))  # [H, L, *]
        gc, bc = g[start:end].t(), beta[start:end].t()  # [H, L]
        cum = gc.cumsum(-1)  # [H, L]
        length = end - start
        strictly_lower = torch.ones(length, length, dtype=torch.bool, device=v.device).tril(-1)
        lower = torch.ones(length, length, dtype=torch.bool, device=v.device).tril()
        diff = cum[:, :, None] - cum[:, None, :]  # [H, L, L]: G_t - G_j
        decay_lower = torch.where(lower, diff, torch.full_like(diff, float("-inf"))).exp()
        kk = torch.einsum("htk,hjk->htj", kc, kc)
        A = bc[:, :, None] * decay_lower * kk * strictly_lower
        eye = torch.eye(length, dtype=A.dtype, device=v.device).expand_as(A)
        rhs = bc[:, :, None] * (vc - cum.exp()[:, :, None] * torch.einsum("htk,hkv->htv", kc, state))
        u = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
        qk = torch.einsum("htk,hjk->htj", qc, kc) * decay_lower
        o = cum.exp()[:, :, None] * torch.einsum("htk,hkv->htv", qc, state) + torch.einsum("htj,hjv->htv", qk, u)
        out[start:end] = o.transpose(0, 1)
        to_end = (cum[:, -1:] - cum).exp()  # [H, L]: exp(G_L - G_j)
        state = cum[:, -1].exp()[:, None, None] * state + torch.einsum("hjk,hjv->hkv", kc * to_end[..., None], u)
    return out, state


def gated_delta_rule_prefill_reference(
    q: torch.Tensor,  # [T, Hk, K]
    k: torch.Tensor,  # [T, Hk, K]
    v: torch.Tensor,  # [T, Hv, V]
    a: torch.Tensor,  # [T, Hv]
    b: torch.Tensor,  # [T, Hv]
    A_log: torch.Tensor,  # [Hv]
    dt_bias: torch.Tensor,  # [Hv]
    state: torch.Tensor,  # [S, Hv, K, V]  (written at state_slots)
    cu_seqlens: torch.Tensor,  # [N + 1] int32
    state_slots: torch.Tensor,  # [N] int32
    cu_seqlens_long: torch.Tensor | None = None,  # [N + 1] int64: cu_seqlens again (the CUDA kernel's hint)
    chunk_indices: torch.Tensor | None = None,  # [num_chunks, 2] int64: host_chunk_indices(cu_seqlens) (the same)
    graphed: bool = False,  # the CUDA kernel's choice of form only
) -> torch.Tensor:
    bounds = cu_seqlens.tolist()
    _check_hints(bounds, cu_seqlens_long, chunk_indices)
    qn, kn, g, beta = prepare_inputs(q, k, a, b, A_log, dt_bias, v.shape[1])
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for i, slot in enumerate(state_slots.tolist()):
        start, end = bounds[i], bounds[i + 1]
        initial = state[slot].float() if slot != NULL_SLOT else state.new_zeros(state.shape[1:], dtype=torch.float32)
        o, final = chunked_reference(qn[start:end], kn[start:end], v[start:end], g[start:end], beta[start:end], initial)
        out[start:end] = o
        if slot != NULL_SLOT:
            state[slot] = final.to(state.dtype)
    return out.to(v.dtype)


def _check_hints(bounds: list[int], cu_seqlens_long: torch.Tensor | None, chunk_indices: torch.Tensor | None) -> None:
    """The optional arguments of the prefill op must equal what they summarise (checked by the reference only)."""
    if cu_seqlens_long is not None and (cu_seqlens_long.dtype != torch.long or cu_seqlens_long.tolist() != bounds):
        raise ValueError("cu_seqlens_long must be cu_seqlens as int64")
    if chunk_indices is not None:
        want = host_chunk_indices(bounds)
        rows = chunk_indices.shape[0] if chunk_indices.dim() == 2 else 0
        if (chunk_indices.dtype != torch.long or chunk_indices.shape != (rows, 2) or rows * 2 < len(want)
                or chunk_indices.flatten().tolist() != host_chunk_indices(bounds, num_rows=rows)):
            raise ValueError("chunk_indices must be host_chunk_indices(cu_seqlens) (skip rows after it allowed) as a "
                             "[num_chunks, 2] int64 tensor")


def _gated_delta_rule_prefill_fake(
    q, k, v, a, b, A_log, dt_bias, state, cu_seqlens, state_slots, cu_seqlens_long=None, chunk_indices=None,
    graphed=False,
):
    return v.new_empty(v.shape)  # references return contiguous tensors


gated_delta_rule_prefill = define_op(
    "gated_delta_rule_prefill(Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias, "
    "Tensor(a!) state, Tensor cu_seqlens, Tensor state_slots, Tensor? cu_seqlens_long=None, "
    "Tensor? chunk_indices=None, bool graphed=False) -> Tensor",
    reference=gated_delta_rule_prefill_reference,
    cuda=delta_rule_kernels.gated_delta_rule_prefill if HAVE_TRITON else None,
    fake=_gated_delta_rule_prefill_fake,
)


def gated_delta_rule_decode_reference(
    q: torch.Tensor,  # [B, Hk, K]
    k: torch.Tensor,  # [B, Hk, K]
    v: torch.Tensor,  # [B, Hv, V]
    a: torch.Tensor,  # [B, Hv]
    b: torch.Tensor,  # [B, Hv]
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,  # [S, Hv, K, V]  (written at state_slots)
    state_slots: torch.Tensor,  # [B] int32
) -> torch.Tensor:
    qn, kn, g, beta = prepare_inputs(q, k, a, b, A_log, dt_bias, v.shape[1])
    slots = state_slots.long()
    live = (slots != NULL_SLOT)[:, None, None, None]  # padding lanes: a zero state, their slot left as it was
    before = state[slots]
    s = torch.where(live, before.float(), 0.0) * g.exp()[:, :, None, None]  # [B, Hv, K, V]
    u = (v.float() - torch.einsum("bhkv,bhk->bhv", s, kn)) * beta[:, :, None]
    s = s + kn[:, :, :, None] * u[:, :, None, :]
    out = torch.einsum("bhkv,bhk->bhv", s, qn)
    state.index_copy_(0, slots, torch.where(live, s.to(state.dtype), before))  # no host sync: a graph may hold it
    return out.to(v.dtype)


def _gated_delta_rule_decode_fake(q, k, v, a, b, A_log, dt_bias, state, state_slots):
    return v.new_empty(v.shape)  # references return contiguous tensors


gated_delta_rule_decode = define_op(
    "gated_delta_rule_decode(Tensor q, Tensor k, Tensor v, Tensor a, Tensor b, Tensor A_log, Tensor dt_bias, "
    "Tensor(a!) state, Tensor state_slots) -> Tensor",
    reference=gated_delta_rule_decode_reference,
    cuda=delta_rule_kernels.gated_delta_rule_decode if HAVE_TRITON else None,
    fake=_gated_delta_rule_decode_fake,
)
