"""Speculative decoding's acceptance rule: which drafts a verify step keeps and the target's next token, on the
device with no host sync (compiled_engine/speculative.py has the round).

The drafts are greedy (the MTP layer's argmax): a one-hot draft distribution q. Leviathan et al. 2023 and Chen et
al. 2023 accept draft d with probability min(1, p(d) / q(d)) = p(d), and after a rejection draw from the residual
max(p - q, 0), normalised: p without d. For a one-hot q that is exactly: draw x from p; accept iff x == d; emit x.
(x == d has probability p(d); given x != d, x is distributed as p without d.) So every verified row i of a sequence
draws the token that non-speculative sampling draws at that output index (``ce::sample``, ops/sample.py, with the
request's temperature, top-k, top-p, min-p, min_tokens suppression, its seed, and the output index as the counter),
and the sequence keeps its drafts up to the first that differs from its row's draw, then that draw: the row after
the last accepted draft gives the correction, or, all k accepted, the bonus. Greedy rows draw the argmax: a draft
is accepted iff it is the target's argmax.

So the output is distributed as non-speculative sampling's, and a seeded request emits the very tokens of its
non-speculative run (up to a tie that the verify step's and a decode step's logits, computed in another order,
break apart), whatever else is in the batch.
"""

from __future__ import annotations

import torch

from compiled_engine.sampler import SamplingBatch, sample
from compiled_engine.speculative import accept_drafts


def rejection_sample(
    logits: torch.Tensor, drafts: torch.Tensor, batch: SamplingBatch
) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits`` ``[N * (k+1), V]`` (a verify step's, sequence by sequence), ``drafts`` ``[N, k]`` int64, ``batch``
    the per-row sampling parameters of the ``N * (k+1)`` rows (counters: each row's output index; min_tokens
    suppression row by row). Returns ``accept_drafts``'s ``(num_accepted, tokens)``."""
    n, k = drafts.shape
    return accept_drafts(drafts, sample(logits, batch).view(n, k + 1))
