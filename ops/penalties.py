"""``ce::apply_penalties_``: presence, frequency and repetition penalties on some rows of a step's logits, in place.

As vLLM and OpenAI define them: a token in the row's prompt or output has a positive logit divided by the repetition
penalty and a negative one multiplied by it; then a token generated c > 0 times loses frequency x c + presence.

* ``ce::apply_penalties_(logits [B, V] fp32 (written), rows [P] int64, prompt_tokens [P, Lp] int64, output_tokens
  [P, Lo] int64, presence [P] fp32, frequency [P] fp32, repetition [P] fp32)``: penalised row i is ``logits[rows[i]]``
  (distinct rows); its token tables are padded with V (ignored). The other rows are left as they are.

Why an op: the sampler applies penalties to every penalised row of every step, outside the decode graph; in plain
torch that is some fifteen passes over ``[P, V]`` temporaries (V = 248,320 for Qwen3.5), the CUDA kernel
(ops/triton/penalty_kernels.py) one pass after two scatters.
"""

from __future__ import annotations

import torch

from ops.library import define_op
from ops.triton import HAVE_TRITON

if HAVE_TRITON:  # else the reference serves CUDA too (ops/triton/__init__.py)
    from ops.triton import penalty_kernels


def apply_penalties_reference(logits: torch.Tensor, rows: torch.Tensor, prompt_tokens: torch.Tensor,
                              output_tokens: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor,
                              repetition: torch.Tensor) -> None:
    vocab = logits.shape[-1]
    values = logits.index_select(0, rows)
    n, device = values.shape[0], values.device
    counts = torch.zeros(n, vocab + 1, dtype=torch.float32, device=device)
    counts.scatter_add_(1, output_tokens, torch.ones(output_tokens.shape, dtype=torch.float32, device=device))
    seen = torch.zeros(n, vocab + 1, dtype=torch.bool, device=device)
    seen.scatter_(1, prompt_tokens, True)
    counts, seen = counts[:, :vocab], seen[:, :vocab]
    generated = counts > 0
    factor = torch.where(seen | generated, repetition[:, None], 1.0)
    values = torch.where(values > 0, values / factor, values * factor)
    values = values - frequency[:, None] * counts - presence[:, None] * generated
    logits.index_copy_(0, rows, values)


def _apply_penalties_fake(logits, rows, prompt_tokens, output_tokens, presence, frequency, repetition):
    return None


apply_penalties_op = define_op(
    "apply_penalties_(Tensor(a!) logits, Tensor rows, Tensor prompt_tokens, Tensor output_tokens, Tensor presence, "
    "Tensor frequency, Tensor repetition) -> ()",
    reference=apply_penalties_reference,
    cuda=penalty_kernels.apply_penalties_ if HAVE_TRITON else None,
    fake=_apply_penalties_fake,
)
