"""Causal depthwise conv1d + SiLU over the q,k,v channels of a Gated DeltaNet layer, with per-slot state.

The conv state of a sequence is its last ``W - 1`` PRE-conv inputs: ``conv_state[slot]`` is ``[C, W - 1]``,
oldest first, in the model dtype. A fresh sequence's slot is zeroed when it is allocated, which is exactly the
left zero padding of a causal conv.

* ``causal_conv1d_prefill``: varlen tokens ``x [T, C]`` packed by ``cu_seqlens``; sequence n starts from
  ``conv_state[state_slots[n]]`` and its final state is written back there. The output comes split along the
  channels into three ``sections`` (a Gated DeltaNet layer's q | k | v; widths may be 0), each its own contiguous
  ``[T, width]`` tensor:
  the chunked delta rule (FLA) reads contiguous q, k and v, and a split of one ``[T, C]`` output would need a copy
  of each.
* ``causal_conv1d_decode``: one token per sequence; the state is shifted in place.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ops.library import define_op
from ops.triton import HAVE_TRITON

if HAVE_TRITON:  # else the references serve CUDA too (ops/triton/__init__.py)
    from ops.triton import conv1d_kernels


def _conv_with_history(history: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """history [W-1, C] then x [L, C] -> silu(conv) for the L new positions, fp32 [L, C]."""
    width = weight.shape[1]
    padded = torch.cat([history.float(), x.float()], dim=0)  # [W-1+L, C]
    windows = padded.unfold(0, width, 1)  # [L, C, W]
    return F.silu((windows * weight.float()[None]).sum(-1))


def causal_conv1d_prefill_reference(
    x: torch.Tensor,  # [T, C]
    weight: torch.Tensor,  # [C, W]
    conv_state: torch.Tensor,  # [S, C, W-1]  (written at state_slots)
    cu_seqlens: torch.Tensor,  # [N + 1] int32
    state_slots: torch.Tensor,  # [N] int32
    sections: list[int],  # the three output widths, summing to C
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_sections(sections, x.shape[1])
    out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    bounds = cu_seqlens.tolist()
    for i, slot in enumerate(state_slots.tolist()):
        start, end = bounds[i], bounds[i + 1]
        if end == start:  # no new tokens: the state is unchanged
            continue
        history = conv_state[slot].transpose(0, 1)  # [W-1, C]
        out[start:end] = _conv_with_history(history, x[start:end], weight)
        combined = torch.cat([history, x[start:end].to(conv_state.dtype)], dim=0)
        conv_state[slot] = combined[-(weight.shape[1] - 1) :].transpose(0, 1)
    return tuple(part.contiguous() for part in out.to(x.dtype).split(list(sections), dim=-1))


def _check_sections(sections: list[int], channels: int) -> None:
    if len(sections) != 3 or min(sections) < 0 or sum(sections) != channels:
        raise ValueError(f"conv sections {list(sections)} must be 3 widths summing to the {channels} channels")


def _causal_conv1d_prefill_fake(x, weight, conv_state, cu_seqlens, state_slots, sections):
    _check_sections(sections, x.shape[1])
    return tuple(x.new_empty(x.shape[0], width) for width in sections)  # references return contiguous tensors


def _causal_conv1d_prefill_cuda(x, weight, conv_state, cu_seqlens, state_slots, sections):
    _check_sections(sections, x.shape[1])
    return conv1d_kernels.causal_conv1d_prefill(x, weight, conv_state, cu_seqlens, state_slots, sections)


causal_conv1d_prefill = define_op(
    "causal_conv1d_prefill(Tensor x, Tensor weight, Tensor(a!) conv_state, Tensor cu_seqlens, "
    "Tensor state_slots, int[] sections) -> (Tensor, Tensor, Tensor)",
    reference=causal_conv1d_prefill_reference,
    cuda=_causal_conv1d_prefill_cuda if HAVE_TRITON else None,
    fake=_causal_conv1d_prefill_fake,
)


def causal_conv1d_decode_reference(
    x: torch.Tensor,  # [B, C]
    weight: torch.Tensor,  # [C, W]
    conv_state: torch.Tensor,  # [S, C, W-1]  (written at state_slots)
    state_slots: torch.Tensor,  # [B] int32
) -> torch.Tensor:
    slots = state_slots.long()
    history = conv_state[slots]  # [B, C, W-1]
    window = torch.cat([history, x.to(conv_state.dtype)[:, :, None]], dim=-1)  # [B, C, W]
    out = F.silu((window.float() * weight.float()[None]).sum(-1))
    conv_state.index_copy_(0, slots, window[:, :, 1:])
    return out.to(x.dtype)


def _causal_conv1d_decode_fake(x, weight, conv_state, state_slots):
    return x.new_empty(x.shape)  # references return contiguous tensors


causal_conv1d_decode = define_op(
    "causal_conv1d_decode(Tensor x, Tensor weight, Tensor(a!) conv_state, Tensor state_slots) -> Tensor",
    reference=causal_conv1d_decode_reference,
    cuda=conv1d_kernels.causal_conv1d_decode if HAVE_TRITON else None,
    fake=_causal_conv1d_decode_fake,
)
