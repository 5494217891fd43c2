"""CUDA implementations of ``ce::gated_delta_rule_decode`` (our Triton kernel) and ``..._prefill`` (FLA).

Decode is the hot op at large batch: its traffic is the recurrent state, ``Hv x K x V`` fp32 per sequence per
layer (1 MiB for the Qwen3.5-0.8B shape), read and written once per token. The kernel therefore reads and
writes the pool IN PLACE at ``state[state_slots[b]]``; a gather -> kernel -> scatter wrapper would triple that
traffic. Everything else is fused into the same pass: q/k l2norm, the K**-0.5 scale, g from A_log/dt_bias/a,
beta from b, and the GQA-style head mapping (value head j reads key head j // (Hv / Hk)). Grid
``(batch, value head, V tiles)``; each program owns a ``[K, BLOCK_V]`` state tile, so no two programs touch the
same state element. Padding lanes (the null slot 0) neither read nor write it: their loads and stores are masked
off, the state taken as zeros (the op's rule).

Prefill is FLA's gated delta rule (varlen, ``cu_seqlens``, grouped value heads natively), called only here, inside
the opaque op, because FLA's entry points are ``torch.compiler.disable``d. Two of its forms, by the step's token
count (``RECURRENT_PREFILL_MAX_TOKENS``):
  * the chunked form (``_fla_chunk_forward``): seven kernels a layer, parallel over chunks of 64 tokens, the one
    that scales to long prompts;
  * the recurrent form (``_fla_recurrent_forward``): one kernel, each program walking its sequence token by token
    with a K x 8 slice of the state in registers. A short eager prompt step is host-bound (every kernel is launched
    from Python), and the chunked form's seven launches cost far more host time than its GPU work. In a captured
    step (``graphed``) launches cost nothing and the chunked form's GPU time is the smaller from ~32 tokens up (one
    sequence, an H200: 47 against 155 µs at 128 tokens), so a captured step takes the chunked form at every length.
Both call the forwards FLA's public functions run, not the public functions: those add a backend dispatch, argument
checks, an autograd Function and an input guard, which cost more host time per call than the forward itself;
outputs and final states are bit-identical (bench/NOTES.md, "FLA's forward called directly").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ops import library
from ops.layouts import CHUNK_SIZE  # FLA's chunk length, the one host_chunk_indices (ops/delta_rule.py) tables
from ops.triton import unit_stride
from ops.triton.fla_configs import use_tuned_configs

# A prompt step of at most this many tokens (all its sequences together) runs FLA's recurrent form, longer ones its
# chunked form (see the module docstring; the crossover: bench/NOTES.md, "Recurrent prefill").
RECURRENT_PREFILL_MAX_TOKENS = 512
L2NORM_EPS = tl.constexpr(1e-6)  # ops.delta_rule.L2NORM_EPS
NULL_SLOT = tl.constexpr(library.NULL_SLOT)  # padding lanes' slot: its state is neither read nor written
SOFTPLUS_THRESHOLD = tl.constexpr(20.0)  # torch.nn.functional.softplus's default: softplus(x) = x above it


@triton.jit
def gates(a, b, A_log, dt_bias):
    """The gates of one value head and token, fp32: ``g = -exp(A_log) * softplus(a + dt_bias)`` (softplus with
    torch's threshold) and ``beta = sigmoid(b)``."""
    gate_in = a.to(tl.float32) + dt_bias.to(tl.float32)
    softplus = tl.where(gate_in > SOFTPLUS_THRESHOLD, gate_in,
                        tl.log(1.0 + tl.exp(tl.minimum(gate_in, SOFTPLUS_THRESHOLD))))
    return -tl.exp(A_log.to(tl.float32)) * softplus, tl.sigmoid(b.to(tl.float32))


@triton.jit
def state_rows(offs_k, slot, DK: tl.constexpr):
    """The rows ``offs_k`` of a state tile that a lane at ``slot`` reads and writes: those below DK, none on the null
    slot (a padding lane: its state taken as zeros, not written). Written as a row count rather than ``mask & (slot !=
    NULL_SLOT)``, which the interpreter rejects (a block and a scalar bool). Shared with the fused decode kernel."""
    return offs_k < (slot != NULL_SLOT).to(tl.int32) * DK


@triton.jit
def decay_and_beta(a, b, A_log, dt_bias):
    """``exp(g)`` and ``beta`` (:func:`gates`). Shared with the fused decode kernel
    (ops/triton/gated_deltanet_kernels.py)."""
    g, beta = gates(a, b, A_log, dt_bias)
    return tl.exp(g), beta


@triton.jit(do_not_specialize=["num_tokens"])  # a new count every prefill step
def _prefill_gates_kernel(a, b, A_log, dt_bias, g, beta, num_tokens, stride_a_t, stride_a_h, stride_b_t, stride_b_h,
                          HEADS: tl.constexpr, HEADS_P: tl.constexpr, BLOCK_T: tl.constexpr):
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_h = tl.arange(0, HEADS_P)
    h_mask = offs_h < HEADS
    mask = (offs_t < num_tokens)[:, None] & h_mask[None, :]
    rows = offs_t.to(tl.int64)[:, None]
    a_tile = tl.load(a + rows * stride_a_t + offs_h[None, :] * stride_a_h, mask=mask, other=0.0)
    b_tile = tl.load(b + rows * stride_b_t + offs_h[None, :] * stride_b_h, mask=mask, other=0.0)
    A = tl.load(A_log + offs_h, mask=h_mask, other=0.0)
    dt = tl.load(dt_bias + offs_h, mask=h_mask, other=0.0)
    g_tile, beta_tile = gates(a_tile, b_tile, A[None, :], dt[None, :])
    tl.store(g + rows * HEADS + offs_h[None, :], g_tile, mask=mask)
    tl.store(beta + rows * HEADS + offs_h[None, :], beta_tile, mask=mask)


def prefill_gates(a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                  block_t: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """``g`` and ``beta`` ``[T, Hv]`` fp32 contiguous from ``a``, ``b`` ``[T, Hv]`` (any strides) in one launch,
    where torch ops took ten (casts, the gate's five element-wise ops, two contiguous copies)."""
    num_tokens, heads = a.shape
    g = torch.empty(num_tokens, heads, dtype=torch.float32, device=a.device)
    beta = torch.empty_like(g)
    if num_tokens:
        A_log, dt_bias = unit_stride(A_log, dt_bias)
        _prefill_gates_kernel[(triton.cdiv(num_tokens, block_t),)](
            a, b, A_log, dt_bias, g, beta, num_tokens, *a.stride(), *b.stride(),
            HEADS=heads, HEADS_P=triton.next_power_of_2(heads), BLOCK_T=block_t, num_warps=4,
        )
    return g, beta


@triton.jit
def _gdr_decode_kernel(
    q,
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    state,
    state_slots,
    out,
    scale,
    stride_q_b,
    stride_q_h,
    stride_q_k,
    stride_k_b,
    stride_k_h,
    stride_k_k,
    stride_v_b,
    stride_v_h,
    stride_v_v,
    stride_a_b,
    stride_a_h,
    stride_b_b,
    stride_b_h,
    stride_s_slot,
    stride_s_h,
    stride_s_k,
    stride_s_v,
    stride_o_b,
    stride_o_h,
    stride_o_v,
    GROUP: tl.constexpr,  # value heads per key head
    DK: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    v_head = tl.program_id(1)
    k_head = v_head // GROUP
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    k_mask = offs_k < DK
    v_mask = offs_v < DV

    # Per-token scalars and vectors, fp32. Every V tile of a head recomputes them: 2 x K loads, noise next to
    # the K x BLOCK_V state tile.
    q_vec = tl.load(q + seq * stride_q_b + k_head * stride_q_h + offs_k * stride_q_k, mask=k_mask,
                    other=0.0).to(tl.float32)
    k_vec = tl.load(k + seq * stride_k_b + k_head * stride_k_h + offs_k * stride_k_k, mask=k_mask,
                    other=0.0).to(tl.float32)
    q_vec = q_vec * tl.rsqrt(tl.sum(q_vec * q_vec, 0) + L2NORM_EPS) * scale
    k_vec = k_vec * tl.rsqrt(tl.sum(k_vec * k_vec, 0) + L2NORM_EPS)
    decay, beta = decay_and_beta(tl.load(a + seq * stride_a_b + v_head * stride_a_h),
                                 tl.load(b + seq * stride_b_b + v_head * stride_b_h), tl.load(A_log + v_head),
                                 tl.load(dt_bias + v_head))
    v_vec = tl.load(v + seq * stride_v_b + v_head * stride_v_h + offs_v * stride_v_v, mask=v_mask,
                    other=0.0).to(tl.float32)

    slot = tl.load(state_slots + seq).to(tl.int64)
    tile = (state + slot * stride_s_slot + v_head * stride_s_h + offs_k[:, None] * stride_s_k
            + offs_v[None, :] * stride_s_v)
    mask = state_rows(offs_k, slot, DK)[:, None] & v_mask[None, :]  # a padding lane: none (zeros, not written)
    s = tl.load(tile, mask=mask, other=0.0).to(tl.float32) * decay  # S *= exp(g)
    u = (v_vec - tl.sum(s * k_vec[:, None], 0)) * beta  # u = (v - S^T k) beta
    s = s + k_vec[:, None] * u[None, :]  # S += k (x) u
    o = tl.sum(s * q_vec[:, None], 0)  # o = S^T q, after the update
    tl.store(tile, s.to(state.dtype.element_ty), mask=mask)
    tl.store(out + seq * stride_o_b + v_head * stride_o_h + offs_v * stride_o_v, o.to(out.dtype.element_ty),
             mask=v_mask)


def gated_delta_rule_decode(
    q: torch.Tensor,  # [B, Hk, K]
    k: torch.Tensor,  # [B, Hk, K]
    v: torch.Tensor,  # [B, Hv, V]
    a: torch.Tensor,  # [B, Hv]
    b: torch.Tensor,  # [B, Hv]
    A_log: torch.Tensor,  # [Hv]
    dt_bias: torch.Tensor,  # [Hv]
    state: torch.Tensor,  # [S, Hv, K, V]  (written at state_slots)
    state_slots: torch.Tensor,  # [B] int32
    block_v: int = 64,
    num_warps: int = 4,
) -> torch.Tensor:
    """In-place decode step. The default tile, BLOCK_V 64 with 4 warps, streams the state at large batch as fast as
    128 and faster than 32 or 16 (bench/NOTES.md, "Delta-rule decode tile"); 64 keeps twice the programs of 128 for
    small batches."""
    batch, num_v_heads, dv = v.shape
    num_k_heads, dk = q.shape[1], q.shape[2]
    out = v.new_empty(v.shape)  # contiguous, like the reference's output
    if batch == 0:
        return out
    block_v = min(block_v, triton.next_power_of_2(dv))
    A_log, dt_bias, state_slots = unit_stride(A_log, dt_bias, state_slots)
    _gdr_decode_kernel[(batch, num_v_heads, triton.cdiv(dv, block_v))](
        q,
        k,
        v,
        a,
        b,
        A_log,
        dt_bias,
        state,
        state_slots,
        out,
        dk**-0.5,
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *a.stride(),
        *b.stride(),
        *state.stride(),
        *out.stride(),
        GROUP=num_v_heads // num_k_heads,
        DK=dk,
        DV=dv,
        BLOCK_K=triton.next_power_of_2(dk),
        BLOCK_V=block_v,
        num_warps=num_warps,
    )
    return out


def gated_delta_rule_prefill(
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
    cu_seqlens_long: torch.Tensor | None = None,  # [N + 1] int64, the same offsets: one object for a whole step
    chunk_indices: torch.Tensor | None = None,  # [num_chunks, 2] int64: ops.delta_rule.host_chunk_indices
    graphed: bool = False,  # a captured step's call: launches cost nothing, so the chunked form at every length
) -> torch.Tensor:
    if v.shape[0] == 0 or state_slots.shape[0] == 0:  # no tokens: every state stays as it is
        return v.new_empty(v.shape)
    g, beta = prefill_gates(a, b, A_log, dt_bias)
    # FLA memoises what it derives from cu_seqlens (chunk offsets; chunk indices when not given) on the identity of
    # the tensor object (fla.utils.tensor_cache, `is`, last 4 calls). The dispatcher hands this function the
    # caller's own Python objects, so the step's cu_seqlens_long, passed by every layer, hits from layer 2 on. It
    # is new every step and never refilled (StepInputs), so a hit is never stale. Without it: a fresh int64 copy
    # per call, which can never be stale, nor hit.
    cu = cu_seqlens_long if cu_seqlens_long is not None else cu_seqlens.to(torch.long, copy=True)
    inputs = (q.to(v.dtype).unsqueeze(0), k.to(v.dtype).unsqueeze(0), v.unsqueeze(0), g.unsqueeze(0),
              beta.unsqueeze(0))
    initial = state.new_empty((state_slots.shape[0], *state.shape[1:]))
    copy_state_rows(state, initial, state_slots, cu_seqlens, gather=True)
    # A shape, not a value: no sync, and the same choice on every rank.
    if v.shape[0] <= RECURRENT_PREFILL_MAX_TOKENS and not graphed:
        o, final = _fla_recurrent_forward(*inputs, initial_state=initial, cu_seqlens=cu)
    else:
        # chunk_indices None: FLA derives them on the device (~12 launches and a host sync)
        o, final = _fla_chunk_forward(*inputs, initial_state=initial, cu_seqlens=cu, chunk_indices=chunk_indices)
    copy_state_rows(final, state, state_slots, cu_seqlens, gather=False)
    return o[0].to(v.dtype)


STATE_ROWS_BLOCK = 8192  # elements a program copies: 32 programs a 1-MiB fp32 row at Qwen3.5-0.8B's shape


@triton.jit
def _state_rows_kernel(src, dst, slots, cu_seqlens, row_size, stride_src, stride_dst, GATHER: tl.constexpr,
                       BLOCK: tl.constexpr):
    """One block of one sequence's state row between the pool and the step's ``[N, row]`` buffer: GATHER, the pool's
    row at the sequence's slot into the buffer; else the buffer's row into the pool at its slot, cast to the pool's
    dtype. A sequence at the null slot (a captured step's padding) neither reads nor writes the pool: it is gathered
    as zeros when it has tokens, and left as the buffer holds it when it has none (FLA only copies such a sequence's
    initial state to its final one, which nothing reads)."""
    seq = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < row_size
    slot = tl.load(slots + seq).to(tl.int64)
    seq = seq.to(tl.int64)
    if slot != NULL_SLOT:
        if GATHER:
            tl.store(dst + seq * stride_dst + offs, tl.load(src + slot * stride_src + offs, mask=mask), mask=mask)
        else:
            values = tl.load(src + seq * stride_src + offs, mask=mask)
            tl.store(dst + slot * stride_dst + offs, values.to(dst.dtype.element_ty), mask=mask)
    elif GATHER:
        if tl.load(cu_seqlens + seq + 1) > tl.load(cu_seqlens + seq):
            tl.store(dst + seq * stride_dst + offs, tl.zeros([BLOCK], dst.dtype.element_ty), mask=mask)


def copy_state_rows(src: torch.Tensor, dst: torch.Tensor, state_slots: torch.Tensor, cu_seqlens: torch.Tensor,
                    gather: bool) -> None:
    """``gather``: ``dst[n] = src[state_slots[n]]`` (src the pool); else ``dst[state_slots[n]] = src[n]`` (dst the
    pool). Null-slot sequences as ``_state_rows_kernel`` says: a captured prompt step's padding sequences (1 MiB of
    state each and layer at Qwen3.5-0.8B's shape) are not written into the buffer nor read out of it, as
    ``state[slots]`` / ``index_copy_`` did."""
    if not (src[0].is_contiguous() and dst[0].is_contiguous()):
        raise ValueError("copy_state_rows: each state row must be contiguous")
    row_size = src[0].numel()
    state_slots, cu_seqlens = unit_stride(state_slots, cu_seqlens)
    grid = (state_slots.shape[0], triton.cdiv(row_size, STATE_ROWS_BLOCK))
    _state_rows_kernel[grid](src, dst, state_slots, cu_seqlens, row_size, src.stride(0), dst.stride(0),
                             GATHER=gather, BLOCK=STATE_ROWS_BLOCK)


def _fla_recurrent_forward(q, k, v, g, beta, initial_state, cu_seqlens):
    """``fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule(..., scale=K**-0.5, use_qk_l2norm_in_kernel=True,
    output_final_state=True)`` without the public wrapper: one kernel. q and k are l2-normalised inside it (the same
    ``x / sqrt(sum(x^2) + 1e-6)``); g and beta come in as the chunked form takes them (``prefill_gates``)."""
    use_tuned_configs(q.device)
    try:
        from fla.ops.gated_delta_rule.fused_recurrent import fused_recurrent_gated_delta_rule_fwd
    except ImportError:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

        return fused_recurrent_gated_delta_rule(
            q, k, v, g=g, beta=beta, scale=q.shape[-1] ** -0.5, initial_state=initial_state,
            output_final_state=True, use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens,
        )
    return fused_recurrent_gated_delta_rule_fwd(
        q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), g=g, beta=beta, scale=q.shape[-1] ** -0.5,
        initial_state=initial_state.contiguous(), output_final_state=True, use_qk_l2norm_in_kernel=True,
        cu_seqlens=cu_seqlens,
    )


def _fla_chunk_forward(q, k, v, g, beta, initial_state, cu_seqlens, chunk_indices):
    """``fla.ops.gated_delta_rule.chunk_gated_delta_rule(..., scale=K**-0.5, use_qk_l2norm_in_kernel=True,
    output_final_state=True)``: the same kernels in the same order, without the public wrapper's host cost.

    What the wrapper does that matters here is repeated: q and k l2-normalised by FLA's own kernel (the same
    ``x * rsqrt(sum(x^2) + 1e-6)`` as our reference), inputs made contiguous, the chunk table derived when not
    given. Value heads > key heads (Qwen3-Next's Hv / Hk) are FLA's native GVA: value head j on key head j // r.
    Another FLA version without these internals falls back to the public function. FLA's kernels read this GPU's
    recorded configs where there are some (ops/triton/fla_configs.py).
    """
    use_tuned_configs(q.device)
    try:
        from fla.modules.norm.l2norm import l2norm_fwd
        from fla.ops.gated_delta_rule.chunk import chunk_gated_delta_rule_fwd
        from fla.ops.utils.index import prepare_chunk_indices
    except ImportError:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        return chunk_gated_delta_rule(
            q, k, v, g, beta, scale=q.shape[-1] ** -0.5, initial_state=initial_state, output_final_state=True,
            use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens, chunk_indices=chunk_indices,
        )
    q, _ = l2norm_fwd(q.contiguous())
    k, _ = l2norm_fwd(k.contiguous())
    if chunk_indices is None:
        chunk_indices = prepare_chunk_indices(cu_seqlens, CHUNK_SIZE)
    _, o, _, final, _, _ = chunk_gated_delta_rule_fwd(
        q=q, k=k, v=v.contiguous(), g=g, beta=beta, scale=q.shape[-1] ** -0.5,
        initial_state=initial_state.contiguous(), output_final_state=True, cu_seqlens=cu_seqlens,
        chunk_indices=chunk_indices, chunk_size=CHUNK_SIZE,
    )
    return o.to(q.dtype), final
