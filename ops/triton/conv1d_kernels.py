"""Triton kernels for ``ce::causal_conv1d_prefill`` and ``ce::causal_conv1d_decode`` (depthwise, SiLU fused).

Conv state layout: ``conv_state[slot]`` is ``[C, W - 1]``, the last ``W - 1`` pre-conv inputs, oldest first.

Why not FLA's varlen ``causal_conv1d`` for prefill: its states are ``[N, C, W]`` (one spare column) and dense per
sequence, so using it would mean a gather into a padded copy, a final-state tensor and a scatter back, plus its
autotuner on the first call; the direct kernels below read and write the pool by slot with no copies.

Prefill is two launches so that no program reads a state another program writes:
  1. outputs from x alone: grid (token tiles over the packed T, channel tiles); a token at position p of its
     sequence reads tap ``p - d`` from x when ``p - d >= 0``, and takes nothing for the taps before its sequence;
  2. per sequence: grid (sequences, channel tiles); each program recomputes its sequence's first W - 1 outputs with
     the taps from the initial state (overwriting launch 1's), then reads the last W - 1 inputs of its sequence
     (from x, or from the old state when the sequence is shorter than W - 1) and writes them to its slot.
The state taps live in launch 2 because only W - 1 tokens a sequence need them: in launch 1 their loads (one slot
row a token, strided along the channels) and pointers took the kernel to 255 registers (ptxas, Triton 3.6, sm_90),
2 programs an SM, for every token.
Decode is one launch, grid (batch, channel tiles), shifting the state in place.

In-place shifts read and write the same slot row in one program; a ``tl.debug_barrier()`` between the loads and
the stores keeps a thread from overwriting an element another thread of the program has yet to read. Padding
lanes (slot 0, the null slot) may race with each other there; nothing reads slot 0.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ops.triton import unit_stride

# The binary search for each token's sequence takes at least this many steps (up to 512 sequences in a step), so the
# kernel is compiled once, not once per power of two of the step's sequence count (each new variant would be compiled
# in the middle of serving, stalling that step ~1 s). Nine steps over an L1-resident cu_seqlens cost next to nothing.
MIN_SEARCH_BITS = 9


@triton.jit
def _section(out0, out1, out2, c_first, num_channels, sec1, sec2):
    """The output tensor a channel block starting at ``c_first`` writes, its first channel and its width: channels
    ``[0, sec1)`` go to ``out0``, ``[sec1, sec2)`` to ``out1``, ``[sec2, C)`` to ``out2``, each ``[T, width]``
    contiguous (a block lies in one section: BLOCK_C divides every width)."""
    if c_first >= sec2:
        out, first, width = out2, sec2, num_channels - sec2
    elif c_first >= sec1:
        out, first, width = out1, sec1, sec2 - sec1
    else:
        out, first, width = out0, 0, sec1
    return out, first, width


# Counts are not specialised (Triton would compile a variant for "divisible by 16" and one for "== 1"): a prefill
# step's token and sequence counts change every step, and a new variant compiled mid-serving stalls that step ~1 s.
@triton.jit(do_not_specialize=["num_tokens", "num_seqs"])
def _conv_prefill_out_kernel(
    x,
    weight,
    cu_seqlens,
    out0,
    out1,
    out2,
    num_tokens,
    num_seqs,
    num_channels,
    sec1,
    sec2,
    stride_x_t,
    stride_x_c,
    stride_w_c,
    stride_w_k,
    WIDTH: tl.constexpr,
    SEARCH_BITS: tl.constexpr,  # 2**SEARCH_BITS > N
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    offs_t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    t_mask = offs_t < num_tokens
    c_mask = offs_c < num_channels
    # Each token's sequence: the last n with cu_seqlens[n] <= t (which skips empty sequences), by a binary
    # search over cu_seqlens here rather than torch ops on the host side (each would cost a launch in eager).
    seq = tl.zeros([BLOCK_T], dtype=tl.int32)
    for i in tl.static_range(SEARCH_BITS):
        candidate = seq + (1 << (SEARCH_BITS - 1 - i))
        ok = t_mask & (candidate < num_seqs)
        start = tl.load(cu_seqlens + candidate, mask=ok, other=0)
        seq = tl.where(ok & (start <= offs_t), candidate, seq)
    position = offs_t - tl.load(cu_seqlens + seq, mask=t_mask, other=0)  # position within the sequence
    tc_mask = t_mask[:, None] & c_mask[None, :]

    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    for j in tl.static_range(WIDTH):
        back = WIDTH - 1 - j  # tap j multiplies the input `back` steps before the current token
        from_x = tl.load(x + (offs_t - back).to(tl.int64)[:, None] * stride_x_t + offs_c[None, :] * stride_x_c,
                         mask=tc_mask & (position >= back)[:, None], other=0.0)
        w = tl.load(weight + offs_c * stride_w_c + j * stride_w_k, mask=c_mask, other=0.0).to(tl.float32)
        acc += from_x.to(tl.float32) * w[None, :]
    y = acc * tl.sigmoid(acc)
    out, first, width = _section(out0, out1, out2, tl.program_id(1) * BLOCK_C, num_channels, sec1, sec2)
    tl.store(out + offs_t.to(tl.int64)[:, None] * width + (offs_c - first)[None, :],
             y.to(out.dtype.element_ty), mask=tc_mask)


@triton.jit
def _conv_prefill_state_kernel(
    x,
    weight,
    conv_state,
    cu_seqlens,
    state_slots,
    out0,
    out1,
    out2,
    num_channels,
    sec1,
    sec2,
    stride_x_t,
    stride_x_c,
    stride_w_c,
    stride_w_k,
    stride_s_slot,
    stride_s_c,
    stride_s_k,
    WIDTH: tl.constexpr,
    HIST_P: tl.constexpr,  # next power of two >= WIDTH - 1
    BLOCK_C: tl.constexpr,
):
    seq = tl.program_id(0)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = offs_c < num_channels
    bos = tl.load(cu_seqlens + seq).to(tl.int64)
    length = tl.load(cu_seqlens + seq + 1).to(tl.int64) - bos
    slot = tl.load(state_slots + seq).to(tl.int64)
    state_rows = conv_state + slot * stride_s_slot + offs_c[:, None] * stride_s_c

    # The first W - 1 outputs, whose early taps read the initial state: tap j of position p reads input p - back,
    # from x when that is >= 0, else history column W - 1 + p - back (all indices static). Summed in the order of the
    # output kernel, over the same values, so these are the outputs it would give with the state's taps.
    lengths = tl.zeros_like(offs_c).to(tl.int64) + length  # over the channels (a scalar mask fails the interpreter)
    out, first, width = _section(out0, out1, out2, tl.program_id(1) * BLOCK_C, num_channels, sec1, sec2)
    for p in tl.static_range(WIDTH - 1):
        live = c_mask & (lengths > p)  # position p exists
        acc = tl.zeros([BLOCK_C], dtype=tl.float32)
        for j in tl.static_range(WIDTH):
            back = WIDTH - 1 - j
            if p - back >= 0:
                value = tl.load(x + (bos + p - back) * stride_x_t + offs_c * stride_x_c, mask=live,
                                other=0.0)
            else:
                value = tl.load(conv_state + slot * stride_s_slot + offs_c * stride_s_c
                                + (WIDTH - 1 + p - back) * stride_s_k, mask=live, other=0.0)
            w = tl.load(weight + offs_c * stride_w_c + j * stride_w_k, mask=c_mask, other=0.0).to(tl.float32)
            acc += value.to(tl.float32) * w
        y = acc * tl.sigmoid(acc)
        tl.store(out + (bos + p) * width + (offs_c - first), y.to(out.dtype.element_ty), mask=live)

    offs_k = tl.arange(0, HIST_P)
    k_mask = offs_k < WIDTH - 1
    src = length - (WIDTH - 1) + offs_k  # position of the input that becomes history column k
    in_x = src >= 0
    mask = c_mask[:, None] & k_mask[None, :]
    from_x = tl.load(x + (bos + src)[None, :] * stride_x_t + offs_c[:, None] * stride_x_c,
                     mask=mask & in_x[None, :], other=0.0)
    # A sequence shorter than W - 1 keeps the newest part of its old history: column k <- old column k + length.
    from_state = tl.load(state_rows + (offs_k + length)[None, :] * stride_s_k, mask=mask & (~in_x)[None, :],
                         other=0.0)
    new = tl.where(in_x[None, :], from_x.to(conv_state.dtype.element_ty), from_state)
    tl.debug_barrier()  # every old-history read above happens before any write below
    tl.store(state_rows + offs_k[None, :] * stride_s_k, new, mask=mask)


def causal_conv1d_prefill(
    x: torch.Tensor,  # [T, C]
    weight: torch.Tensor,  # [C, W]
    conv_state: torch.Tensor,  # [S, C, W-1]  (written at state_slots)
    cu_seqlens: torch.Tensor,  # [N + 1] int32
    state_slots: torch.Tensor,  # [N] int32
    sections: list[int],  # the three output widths, summing to C
    block_t: int = 32,
    block_c: int = 128,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    num_tokens, num_channels = x.shape
    width = weight.shape[1]
    num_seqs = state_slots.shape[0]
    outs = tuple(x.new_empty(num_tokens, w) for w in sections)  # contiguous, like the reference's outputs
    if num_seqs == 0:
        return outs
    block_c = math.gcd(block_c, *sections)  # a power of two dividing every width: a block lies in one section
    bounds = (sections[0], sections[0] + sections[1])
    # An empty section's tensor may have no storage (a null pointer Triton refuses); no channel block writes it, so x
    # stands in for it.
    pointers = tuple(out if out.numel() else x for out in outs)
    cu_seqlens, state_slots = unit_stride(cu_seqlens, state_slots)
    if num_tokens > 0:
        _conv_prefill_out_kernel[(triton.cdiv(num_tokens, block_t), triton.cdiv(num_channels, block_c))](
            x,
            weight,
            cu_seqlens,
            *pointers,
            num_tokens,
            num_seqs,
            num_channels,
            *bounds,
            *x.stride(),
            *weight.stride(),
            WIDTH=width,
            SEARCH_BITS=max(MIN_SEARCH_BITS, num_seqs.bit_length()),
            BLOCK_T=block_t,
            BLOCK_C=block_c,
            num_warps=4,
        )
    # Launched after the output kernel on the same stream: its first W - 1 outputs a sequence replace the output
    # kernel's, and it writes the states after reading the initial ones.
    _conv_prefill_state_kernel[(num_seqs, triton.cdiv(num_channels, block_c))](
        x,
        weight,
        conv_state,
        cu_seqlens,
        state_slots,
        *pointers,
        num_channels,
        *bounds,
        *x.stride(),
        *weight.stride(),
        *conv_state.stride(),
        WIDTH=width,
        HIST_P=triton.next_power_of_2(width - 1),
        BLOCK_C=block_c,
        num_warps=4,
    )
    return outs


@triton.jit
def conv_load(
    weight,
    state_rows,  # conv_state + slot * stride_slot + offs_c * stride_c: this sequence's rows of these channels
    offs_c,
    c_mask,
    stride_w_c,
    stride_w_k,
    stride_s_k,
    WIDTH: tl.constexpr,
    HIST_P: tl.constexpr,  # next power of two >= WIDTH - 1
):
    """The loads of one conv step that do not need the new input: the channels' history, the same history shifted
    left by one column (column k <- k + 1, read now, before the in-place write), and their weights. Split from
    :func:`conv_apply` so a kernel may issue them before it waits for the kernel that writes the input."""
    offs_k = tl.arange(0, HIST_P)
    mask = c_mask[:, None] & (offs_k < WIDTH - 1)[None, :]
    history = tl.load(state_rows[:, None] + offs_k[None, :] * stride_s_k, mask=mask, other=0.0)
    shifted = tl.load(state_rows[:, None] + (offs_k + 1)[None, :] * stride_s_k,
                      mask=c_mask[:, None] & (offs_k + 1 < WIDTH - 1)[None, :], other=0.0)
    w_hist = tl.load(weight + offs_c[:, None] * stride_w_c + offs_k[None, :] * stride_w_k, mask=mask, other=0.0)
    w_new = tl.load(weight + offs_c * stride_w_c + (WIDTH - 1) * stride_w_k, mask=c_mask, other=0.0)
    return history, shifted, w_hist, w_new


@triton.jit
def conv_apply(x_row, offs_c, c_mask, stride_x_c, history, shifted, w_hist, w_new, WIDTH: tl.constexpr,
               HIST_P: tl.constexpr):
    """silu(causal conv) of channels ``offs_c`` for one new token (read from ``x_row``), from :func:`conv_load`'s
    values, and their next history, without writing it: :func:`conv_step` on the loaded input.

    Returns the output rounded to x's dtype (the conv op's output) in fp32, and the shifted history
    ``[len(offs_c), HIST_P]`` for :func:`store_history`, which the caller runs after a barrier (the decode kernel
    here, and ops/triton/gated_deltanet_kernels.py's fused kernel)."""
    x = tl.load(x_row + offs_c * stride_x_c, mask=c_mask, other=0.0)
    return conv_step(x, history, shifted, w_hist, w_new, WIDTH, HIST_P)


@triton.jit
def conv_step(x, history, shifted, w_hist, w_new, WIDTH: tl.constexpr, HIST_P: tl.constexpr):
    """:func:`conv_apply`'s math on the new input ``x`` already loaded (in its own dtype), so a kernel may issue that
    load early (the fused GDN decode kernel loads a V tile's inputs before the previous tile's stores)."""
    offs_k = tl.arange(0, HIST_P)
    # As in the reference, the new input enters the window (and the state) in the state's dtype.
    x_new = x.to(history.dtype)
    acc = tl.sum(history.to(tl.float32) * w_hist.to(tl.float32), 1) + x_new.to(tl.float32) * w_new.to(tl.float32)
    y = acc * tl.sigmoid(acc)
    new_history = tl.where((offs_k == WIDTH - 2)[None, :], x_new[:, None], shifted)
    return y.to(x.dtype).to(tl.float32), new_history


@triton.jit
def store_history(state_rows, c_mask, new_history, stride_s_k, WIDTH: tl.constexpr, HIST_P: tl.constexpr):
    offs_k = tl.arange(0, HIST_P)
    mask = c_mask[:, None] & (offs_k < WIDTH - 1)[None, :]
    tl.store(state_rows[:, None] + offs_k[None, :] * stride_s_k, new_history, mask=mask)


@triton.jit
def _conv_decode_kernel(
    x,
    weight,
    conv_state,
    state_slots,
    out,
    num_channels,
    stride_x_b,
    stride_x_c,
    stride_w_c,
    stride_w_k,
    stride_s_slot,
    stride_s_c,
    stride_s_k,
    stride_o_b,
    stride_o_c,
    WIDTH: tl.constexpr,
    HIST_P: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_mask = offs_c < num_channels
    slot = tl.load(state_slots + seq).to(tl.int64)
    state_rows = conv_state + slot * stride_s_slot + offs_c * stride_s_c
    history, shifted, w_hist, w_new = conv_load(weight, state_rows, offs_c, c_mask, stride_w_c, stride_w_k,
                                                stride_s_k, WIDTH, HIST_P)
    y, new_history = conv_apply(x + seq * stride_x_b, offs_c, c_mask, stride_x_c, history, shifted, w_hist, w_new,
                                WIDTH, HIST_P)
    tl.store(out + seq * stride_o_b + offs_c * stride_o_c, y.to(out.dtype.element_ty), mask=c_mask)
    tl.debug_barrier()  # every read of this slot's history happens before any write below
    store_history(state_rows, c_mask, new_history, stride_s_k, WIDTH, HIST_P)


def causal_conv1d_decode(
    x: torch.Tensor,  # [B, C]
    weight: torch.Tensor,  # [C, W]
    conv_state: torch.Tensor,  # [S, C, W-1]  (written at state_slots)
    state_slots: torch.Tensor,  # [B] int32
    block_c: int = 256,
    num_warps: int = 4,
) -> torch.Tensor:
    """The defaults are within 0-16% (at most ~1 µs a call) of the best of 20 channel blocks and warps at 32-512
    sequences (bench/conv_decode_sweep.py, bench/NOTES.md "Runs 83-85")."""
    batch, num_channels = x.shape
    width = weight.shape[1]
    out = x.new_empty(x.shape)  # contiguous, like the reference's output
    if batch == 0:
        return out
    state_slots = unit_stride(state_slots)
    _conv_decode_kernel[(batch, triton.cdiv(num_channels, block_c))](
        x,
        weight,
        conv_state,
        state_slots,
        out,
        num_channels,
        *x.stride(),
        *weight.stride(),
        *conv_state.stride(),
        *out.stride(),
        WIDTH=width,
        HIST_P=triton.next_power_of_2(width - 1),
        BLOCK_C=block_c,
        num_warps=num_warps,
    )
    return out
