"""``ce::argmax``: each row's greedy token, the first index of its maximum, in the decode graph.

Why an op: greedy decoding needs ``logits.argmax(-1)`` of every decode step. Outside the graph it would be torch's
reduction, one more launch and its gap after every step, over fp32 logits that the graph would have to write for it
(a conversion kernel, whose cost grows with the batch); Inductor does not split an argmax over one long row across
programs, so in the graph it would be one program reading the whole row. The CUDA kernel is two short PDL launches
(ops/triton/argmax_kernels.py) reading the model-dtype logits the lm_head wrote (bench/NOTES.md, "Greedy tokens in
the graph").

* ``ce::argmax(logits [B, V]) -> [B]`` int64: torch.argmax's rule, exactly: the first index of the maximum, and a
  NaN counts as larger than everything (the first NaN wins). Rows may be strided; columns must be contiguous.
"""

from __future__ import annotations

import torch

from ops.library import define_op
from ops.triton import HAVE_TRITON

if HAVE_TRITON:  # else the references serve CUDA too (ops/triton/__init__.py)
    from ops.triton import argmax_kernels


def argmax_reference(logits: torch.Tensor) -> torch.Tensor:
    return torch.argmax(logits, dim=-1)


def _argmax_fake(logits):
    return logits.new_empty((logits.shape[0],), dtype=torch.long)


argmax_op = define_op(
    "argmax(Tensor logits) -> Tensor",
    reference=argmax_reference,
    cuda=argmax_kernels.argmax if HAVE_TRITON else None,
    fake=_argmax_fake,
)
