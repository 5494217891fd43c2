"""Speculative decoding with the checkpoint's MTP layer: what one round computes on the device, and how its steps are
packed (compiled_engine/mtp.py is the layer; Runtime.verify/accept/advance run a round; LLMEngine schedules it).

A round for a sequence of length L (tokens t_0..t_{L-1}, the last one not computed yet) holding k drafts d_1..d_k:

1. verify (``pack_verify_step``): the target scores t_{L-1}, d_1..d_k at positions L-1..L-1+k in one step
   (``StepInputs.speculative``): attention layers write KV for every position (rejected ones are overwritten by
   later steps: attention never reads past a sequence's length), linear layers keep each position's state in
   their verify history (compiled_engine/gated_deltanet.py). Logits ``[N * (k+1), vocab]``.
2. acceptance (compiled_engine/rejection_sampler.py): a in 0..k drafts accepted and one more token b from the target
   (the correction, or the bonus when all k are accepted), on the device.
3. commit (``HybridModel.commit_verify``): the linear layers' pools take the state after position L-1+a.
4. draft (``draft``): the MTP layer runs over the same k+1 rows with the next tokens (d_1..d_a, b at row a): its KV
   entry at position p is ``(h_p, token_{p+1})``, entries past row a are overwritten by the next round's pass; row a's
   output predicts e_1, and k-1 more single-row MTP steps (decode steps at positions L+a, L+a+1, ...) predict
   e_2..e_k: greedy drafts (a one-hot draft distribution, which the rejection sampler relies on).
After a prompt's last chunk the MTP pass runs over the chunk's rows (next tokens: the prompt shifted by one, then
the sampled token) and drafts from its last row; after a middle chunk it only fills the MTP's KV.

The MTP layer's KV shares the target's blocks. A round writes at most positions L-1..L+2k-2; blocks for the
verified positions are guaranteed by the scheduler, those for the draft positions beyond them are taken when free
(else those entries land in the null block: they only serve this round's later drafts, so the drafts get worse,
never the output).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence as Seq

import torch
import torch.nn.functional as F

from compiled_engine.model import HybridModel
from compiled_engine.sequence import Sequence
from compiled_engine.step import pack_step
from ops.library import NULL_BLOCK, NULL_SLOT
from ops.step import StepInputs


@dataclass
class SpeculativeStep:
    """A step of speculative decoding between its target forward and its drafts: the sequences, the packed step,
    the target's hidden states of every row ``[T, H]``, each sequence's computed-token count before the step and
    its tokens in it, the step's fp32 logits (a prefill step's: of each sequence's last row; a verify step's: of
    every row), and (a prefill step) which sequences it computed completely."""

    seqs: list[Sequence]
    step: StepInputs
    hidden: torch.Tensor
    starts: list[int]
    counts: list[int]
    logits: torch.Tensor
    completed: list[bool] | None = None


class _Tokens:
    """A sequence's token list seen from ``offset`` on: ``pack_step`` slices only the tokens it computes."""

    def __init__(self, offset: int, tokens: list[int]):
        self.offset = offset
        self.tokens = tokens

    def __getitem__(self, index: slice) -> list[int]:
        return self.tokens[index.start - self.offset : index.stop - self.offset]


@dataclass
class _VerifyRow:
    """What ``pack_step`` reads of a sequence, with its drafts after its last token."""

    token_ids: _Tokens
    num_computed_tokens: int
    block_table: list[int]
    state_slot: int


def pack_verify_step(
    seqs: Seq[Sequence], drafts: Seq[Seq[int]], block_size: int, device: torch.device
) -> StepInputs:
    """The verify step of ``seqs`` (each with exactly its last token uncomputed) and their ``drafts`` (k each): k+1
    rows per sequence at positions ``num_computed_tokens ..`` + k. Positions past a sequence's blocks (beyond
    max_model_len) map to the null block: only rows whose tokens could never be emitted reach them."""
    rows = []
    for seq, draft in zip(seqs, drafts):
        start = seq.num_computed_tokens
        missing = -(-(start + len(draft) + 1) // block_size) - len(seq.block_table)
        table = seq.block_table + [NULL_BLOCK] * missing if missing > 0 else seq.block_table
        rows.append(_VerifyRow(_Tokens(start, [seq.token_ids[start], *draft]), start, table, seq.state_slot))
    step = pack_step(rows, [len(d) + 1 for d in drafts], True, block_size, device)
    return dataclasses.replace(step, speculative=True)


@torch.inference_mode()
def draft(
    model: HybridModel,
    step: StepInputs,
    hidden: torch.Tensor,
    next_ids: torch.Tensor,
    rows: torch.Tensor,
    seq_rows: torch.Tensor,
    num_drafts: int,
    block_size: int,
) -> torch.Tensor:
    """Greedy drafts ``[len(rows), num_drafts]`` int64, on the device (no host sync).

    The MTP layer runs over every row of ``step`` with ``hidden`` (the target's, ``[T, H]``) and ``next_ids`` (each
    row's next token, ``[T]``), writing its KV there; ``rows`` are the rows to draft from (one per drafting sequence)
    and ``seq_rows`` their sequences' rows of ``step.block_tables``. Each further draft is a one-row MTP decode step
    at the next position, on the previous step's output."""
    out = model.mtp_forward(next_ids, hidden, step)
    if rows.numel() == 0:  # only middle chunks of prompts: their MTP KV is all this step needed
        return rows.new_empty((0, num_drafts))
    h = out[rows]
    tokens = model.compute_logits(h).argmax(dim=-1)
    drafts = [tokens]
    if num_drafts > 1:
        positions = step.positions[rows]
        # Wide enough for the furthest draft position: the columns past a sequence's blocks are the null block.
        tables = F.pad(step.block_tables[seq_rows], (0, -(-num_drafts // block_size) + 1), value=NULL_BLOCK)
        null_slots = torch.full_like(positions, NULL_SLOT, dtype=torch.int32)
        for _ in range(num_drafts - 1):
            positions = positions + 1
            blocks = tables.gather(1, (positions // block_size)[:, None])[:, 0].long()
            decode = StepInputs(
                input_ids=tokens,
                positions=positions,
                slot_mapping=blocks * block_size + positions % block_size,
                block_tables=tables,
                context_lens=(positions + 1).to(torch.int32),
                state_slots=null_slots,
            )
            h = model.mtp_forward(tokens, h, decode)
            tokens = model.compute_logits(h).argmax(dim=-1)
            drafts.append(tokens)
    return torch.stack(drafts, dim=1)
