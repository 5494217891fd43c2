"""Triton kernel for ``ce::apply_penalties_``: presence, frequency and repetition penalties on a step's logits.

The penalised rows' tokens become one dense int32 code per (row, token) first, in two torch scatters over a zeroed
``[P, V + 1]`` buffer: bit 30 set where the token is in the prompt, the low 30 bits its count in the output (column V
takes the tables' padding). Then one pass over ``(P, V / BLOCK)`` programs reads each penalised row's logits and its
codes and writes the penalised logits in place. The unfused torch form (the reference) makes and reads some fifteen
``[P, V]`` temporaries (counts, masks, the repetition factors, each product and difference, the gathered rows): ~110
bytes an element; this zeroes the codes, reads the logits and the codes once and writes the logits once: ~16, ~6 GB
less a step at 256 rows of Qwen3.5's vocabulary. The arithmetic is the reference's, operation for operation
(division rounded to nearest, no FMA contraction), so the two agree bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048
IN_PROMPT = 1 << 30  # the code's prompt bit; the output count lives in the bits below it


# The strides of the per-row inputs are not specialised: the rows are a column of the sampler's token table, whose
# width (a step's longest prompt and output) is sometimes a multiple of 16, which would compile another variant.
@triton.jit(do_not_specialize=["stride_rows", "stride_presence", "stride_frequency", "stride_repetition"])
def _apply_penalties_kernel(logits, stride_row, rows, stride_rows, codes, V, presence, stride_presence, frequency,
                            stride_frequency, repetition, stride_repetition, IN_PROMPT: tl.constexpr,
                            BLOCK: tl.constexpr):
    p = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < V
    row_ptr = logits + tl.load(rows + p * stride_rows) * stride_row + cols
    x = tl.load(row_ptr, mask=mask, other=0.0)
    code = tl.load(codes + p * (V + 1) + cols, mask=mask, other=0)
    count = (code & (IN_PROMPT - 1)).to(tl.float32)
    generated = (count > 0).to(tl.float32)
    r = tl.where(code != 0, tl.load(repetition + p * stride_repetition), 1.0)
    x = tl.where(x > 0, tl.div_rn(x, r), x * r)
    x = x - tl.load(frequency + p * stride_frequency) * count
    x = x - tl.load(presence + p * stride_presence) * generated
    tl.store(row_ptr, x, mask=mask)


def penalty_codes(prompt_tokens: torch.Tensor, output_tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """``[P, V + 1]`` int32: IN_PROMPT where the token is in the row's prompt, plus its count in the row's output
    (the tables padded with ``vocab``)."""
    codes = torch.zeros((prompt_tokens.shape[0], vocab + 1), dtype=torch.int32, device=prompt_tokens.device)
    codes.scatter_(1, prompt_tokens, IN_PROMPT)
    return codes.scatter_add_(1, output_tokens, torch.ones_like(output_tokens, dtype=torch.int32))


def apply_penalties_(logits: torch.Tensor, rows: torch.Tensor, prompt_tokens: torch.Tensor,
                     output_tokens: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor,
                     repetition: torch.Tensor) -> None:
    vocab = logits.shape[1]
    if rows.numel() == 0 or vocab == 0:
        return
    if logits.dtype != torch.float32 or logits.stride(1) != 1:
        raise ValueError(f"apply_penalties_: logits must be fp32 with contiguous columns, got {logits.dtype} "
                         f"strides {logits.stride()}")
    codes = penalty_codes(prompt_tokens, output_tokens, vocab)
    # every [P] input may be a strided view (the sampler's rows are a column of its uploaded token table)
    _apply_penalties_kernel[(rows.numel(), triton.cdiv(vocab, BLOCK))](
        logits, logits.stride(0), rows, rows.stride(0), codes, vocab, presence, presence.stride(0), frequency,
        frequency.stride(0), repetition, repetition.stride(0), IN_PROMPT=IN_PROMPT, BLOCK=BLOCK, num_warps=4,
        enable_fp_fusion=False)  # no FMA contraction: the reference's roundings
