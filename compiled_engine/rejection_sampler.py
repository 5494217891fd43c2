"""Speculative decoding's acceptance rule: which drafts a verify step keeps and the target's next token, on the
device with no host sync (compiled_engine/speculative.py has the round).

The drafts are greedy (the MTP layer's argmax): a one-hot draft distribution q. Per sequence, for row i (the
target's distribution p_i of the token after draft i, with the request's temperature, top-k, top-p, min-p and
min_tokens suppression, as ``ce::sample`` draws), draft d_{i+1} is accepted

* greedy requests: iff it is p_i's argmax (so the output is the non-speculative greedy output, token for token);
* sampled requests: with probability min(1, p_i(d) / q(d)) = p_i(d) (Leviathan et al. 2023, Chen et al. 2023).

The first rejected row i draws the correction from the residual max(p_i - q, 0), normalised: p_i without d_{i+1};
when all k are accepted, row k draws the bonus from p_k. Either way the token at each output index is distributed as
non-speculative sampling draws it. Randomness is counter-based, as in ``ce::sample`` (ops/sample.py): row i of a
request draws with (seed, counter = the output index of its token), the acceptance test with the uniform of
(seed, counter + ACCEPT_STREAM, vocab id 0), a stream no draw uses. So a seeded request's tokens do not depend on
the rest of the batch.
"""

from __future__ import annotations

import torch

from compiled_engine.sampler import SamplingBatch
from ops.sample import filtered_scaled_logits, sample_op, uniform_noise

ACCEPT_STREAM = 1 << 40  # counter offset of the acceptance tests' uniforms


def rejection_sample(
    logits: torch.Tensor, drafts: torch.Tensor, batch: SamplingBatch
) -> tuple[torch.Tensor, torch.Tensor]:
    """``logits`` ``[N * (k+1), V]`` fp32 (a verify step's, sequence by sequence), ``drafts`` ``[N, k]`` int64,
    ``batch`` the per-row sampling parameters of the ``N * (k+1)`` rows (counters: each row's output index).

    Returns ``(num_accepted [N] int64, tokens [N, k+1] int64)``: ``tokens[n, :a]`` are the accepted drafts and
    ``tokens[n, a]`` the target's next token (the entries after it are drafts, valid ids, never output)."""
    n, k = drafts.shape
    vocab = logits.shape[-1]
    if batch.suppress_rows.numel():
        logits = logits.index_put((batch.suppress_rows, batch.suppress_tokens), torch.tensor(float("-inf")))
    greedy = logits.argmax(dim=-1).view(n, k + 1)
    accept = drafts == greedy[:, :k]
    candidates = greedy
    if not batch.all_greedy:
        kept, sampled = filtered_scaled_logits(logits, batch.temperature, batch.top_k, batch.top_p, batch.min_p,
                                               batch.use_top_k, batch.use_top_p)
        kept = kept.view(n, k + 1, vocab)
        p_draft = torch.softmax(kept[:, :k], dim=-1).gather(2, drafts[..., None])[..., 0]
        uniform = uniform_noise(batch.seeds, batch.counters + ACCEPT_STREAM, 1).view(n, k + 1)[:, :k]
        # The residual of row i < k: its distribution without the draft (q is one-hot); row k: as it is.
        residual = kept.clone()
        residual[:, :k].scatter_(2, drafts[..., None], float("-inf"))
        rows = n * (k + 1)
        ones = torch.ones(rows, device=logits.device)
        drawn = sample_op(
            residual.view(rows, vocab), ones, torch.zeros(rows, dtype=torch.long, device=logits.device), ones,
            torch.zeros(rows, device=logits.device), batch.seeds, batch.counters, False, False,
        ).view(n, k + 1)
        sampled = sampled.view(n, k + 1)
        accept = torch.where(sampled[:, :k], uniform < p_draft, accept)
        candidates = torch.where(sampled, drawn, greedy)
    num_accepted = accept.long().cumprod(dim=1).sum(dim=1)
    tokens = torch.cat([drafts, drafts[:, :1]], dim=1)
    tokens.scatter_(1, num_accepted[:, None], candidates.gather(1, num_accepted[:, None]))
    return num_accepted, tokens
