"""Speculative decoding with the checkpoint's MTP layer: what one round computes on the device, and how its steps are
packed (compiled_engine/mtp.py is the layer; Runtime.verify/accept/advance run a round; LLMEngine schedules it).

A round for a sequence of length L (tokens t_0..t_{L-1}, the last one not computed yet) holding k drafts d_1..d_k:

1. verify (``pack_verify_step``): the target scores t_{L-1}, d_1..d_k at positions L-1..L-1+k in one step
   (``StepInputs.speculative``): attention layers write KV for every position (rejected ones are overwritten by
   later steps: attention never reads past a sequence's length), linear layers commit position L-1 (always
   accepted) and keep the later positions' states apart (compiled_engine/gated_deltanet.py). Logits
   ``[N * (k+1), vocab]``.
2. acceptance (compiled_engine/rejection_sampler.py): a in 0..k drafts accepted and one more token b from the target
   (the correction, or the bonus when all k are accepted), on the device.
3. commit (``HybridModel.commit_verify``): the linear layers' pools take the state after position L-1+a.
4. draft (``draft``): the MTP layer runs over the same k+1 rows with the next tokens (d_1..d_a, b at row a): its KV
   entry at position p is ``(h_p, token_{p+1})``, entries past row a are overwritten by the next round's pass; row a's
   output predicts e_1, and k-1 more single-row MTP steps (decode steps at positions L+a, L+a+1, ...) predict
   e_2..e_k: greedy drafts (a one-hot draft distribution, which the rejection sampler relies on).
After a prompt's last chunk the MTP pass runs over the chunk's rows (next tokens: the prompt shifted by one, then
the sampled token) and drafts from its last row; after a middle chunk it only fills the MTP's KV.

A round of greedy requests (the engine's common case: no sampling, no min_tokens suppression) is one function,
``greedy_round``: verify, acceptance, commit and drafts with nothing read on the host. ``SpeculativeRound`` runs it
eagerly, or compiled (``torch.compile(fullgraph=True)``; on CUDA with mode "reduce-overhead", whose cudagraph trees
capture one CUDA graph per bucket of sequences), the batch padded to its bucket with null rows (the null slot, the
null block). Sampled rounds run the unfused path (``Runtime.verify``, the rejection sampler, ``Runtime.accept``).

The MTP layer's KV shares the target's blocks. A round writes at most positions L-1..L+2k-2; blocks for the
verified positions are guaranteed by the scheduler, those for the draft positions beyond them are taken when free
(else those entries land in the null block: they only serve this round's later drafts, so the drafts get worse,
never the output).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Sequence as Seq

import torch
import torch.nn.functional as F

from compiled_engine.model import HybridModel
from compiled_engine.sequence import Sequence
from compiled_engine.step import pack_step
from graphs.buckets import BucketPolicy
from graphs.decode_graph import raise_recompile_limit, register_inductor_fallbacks
from ops.library import NULL_BLOCK, NULL_SLOT, OPS
from ops.step import StepInputs

logger = logging.getLogger(__name__)


@dataclass
class SpeculativeStep:
    """A step of speculative decoding between its target forward and its drafts: the sequences, the packed step,
    the target's hidden states of every row ``[T, H]``, each sequence's computed-token count before the step and
    its tokens in it, the step's fp32 logits (a prefill step's: of each sequence's last row; a verify step's: of
    every row), and (a prefill step) which sequences it computed completely."""

    seqs: list[Sequence]
    step: StepInputs | None  # None: a greedy round (its step stayed inside SpeculativeRound)
    hidden: torch.Tensor | None
    starts: list[int]
    counts: list[int]
    logits: torch.Tensor | None
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
    seqs: Seq[Sequence], drafts: Seq[Seq[int]], block_size: int, device: torch.device, pad_to: int | None = None,
    num_drafts: int | None = None, table_width: int | None = None,
) -> StepInputs:
    """The verify step of ``seqs`` (each with exactly its last token uncomputed) and their ``drafts`` (k each): k+1
    rows per sequence at positions ``num_computed_tokens ..`` + k. Positions past a sequence's blocks (beyond
    max_model_len) map to the null block: only rows whose tokens could never be emitted reach them. ``pad_to``:
    that many sequences, the extra ones padding (token 0 at positions 0..k, the null block, the null slot).
    ``num_drafts``: k, for a step of padding only. ``table_width``: block tables of that many columns (at least
    every sequence's blocks), the null block after a sequence's end."""
    k = len(drafts[0]) if num_drafts is None else num_drafts
    padding = _VerifyRow(_Tokens(0, [0] * (k + 1)), 0, [], NULL_SLOT)  # read like a Sequence below
    rows = []
    for seq, draft in [*zip(seqs, drafts), *[(padding, [0] * k)] * ((pad_to or len(seqs)) - len(seqs))]:
        start = seq.num_computed_tokens
        missing = max(-(-(start + len(draft) + 1) // block_size), table_width or 0) - len(seq.block_table)
        table = seq.block_table + [NULL_BLOCK] * missing if missing > 0 else seq.block_table
        tokens = seq.token_ids[start : start + len(draft) + 1] if seq is padding else [seq.token_ids[start], *draft]
        rows.append(_VerifyRow(_Tokens(start, tokens), start, table, seq.state_slot))
    step = pack_step(rows, [k + 1] * len(rows), True, block_size, device)
    return dataclasses.replace(step, speculative=True)


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


def greedy_round(
    model: HybridModel,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    state_slots: torch.Tensor,
    cu_seqlens: torch.Tensor,
    num_drafts: int,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A whole round for greedy sequences, from a verify step's tensors (``pack_verify_step``): the target's verify
    step, acceptance (the argmax prefix), the commit of the linear layers' states, and the MTP drafts. Returns
    ``(num_accepted [N], tokens [N, k+1], drafts [N, k])`` as ``Runtime.verify``/``accept`` and the rejection
    sampler's greedy rule do; nothing is read on the host (the traced function of ``SpeculativeRound``)."""
    step = StepInputs(input_ids, positions, slot_mapping, block_tables, context_lens, state_slots, cu_seqlens,
                      is_prefill=True, speculative=True)
    n, k = state_slots.shape[0], num_drafts
    hidden = model(step)
    greedy = model.compute_logits(hidden).argmax(dim=-1).view(n, k + 1)
    proposed = input_ids.view(n, k + 1)[:, 1:]
    accepted = (proposed == greedy[:, :k]).long().cumprod(dim=1).sum(dim=1)
    tokens = torch.cat([proposed, proposed[:, :1]], dim=1).scatter(1, accepted[:, None],
                                                                   greedy.gather(1, accepted[:, None]))
    index = torch.arange(n, device=input_ids.device)
    model.commit_verify(state_slots, accepted)
    drafts = draft(model, step, hidden, tokens.reshape(-1), index * (k + 1) + accepted, index, k, block_size)
    return accepted, tokens, drafts


class SpeculativeRound:
    """Runs ``greedy_round``: eagerly, or compiled with one graph per bucket of sequences (CUDA graphs on CUDA).

    ``compile``: ``torch.compile(fullgraph=True)`` (mode "reduce-overhead" on CUDA: cudagraph trees capture and
    replay; Inductor's C++ code on the CPU), every bucket compiled at ``warmup`` on padding rows only (the null slot
    and block: live sequences keep their state), largest first; later rounds run under ``fail_on_recompile``."""

    def __init__(self, model: HybridModel, num_drafts: int, block_size: int, max_num_seqs: int, max_model_len: int,
                 device: torch.device, compile: bool = False):
        self.model = model
        # Compiled rounds have block tables of one width: up to the furthest verified position.
        self.table_width = -(-(max_model_len + num_drafts) // block_size) if compile else None
        self.num_drafts = num_drafts
        self.block_size = block_size
        self.device = device
        self.policy = BucketPolicy.create(max_num_seqs) if compile else None
        self.fn = greedy_round
        self.compiled = compile
        if compile:
            register_inductor_fallbacks(OPS)
            raise_recompile_limit(2 * len(self.policy))
            mode = "reduce-overhead" if device.type == "cuda" else None
            self.fn = torch.compile(greedy_round, mode=mode, fullgraph=True)

    @torch.inference_mode()
    def warmup(self) -> None:
        """Compile (and on CUDA capture) every bucket, largest first."""
        if not self.compiled:
            return
        start = time.perf_counter()
        for bucket in reversed(self.policy.sizes):
            for _ in range(3):  # cudagraph trees: a warm-up run, the recording, a replay
                self._run(pack_verify_step([], [], self.block_size, self.device, bucket, self.num_drafts,
                                           self.table_width))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        logger.info("compiled speculative rounds: buckets %s in %.1f s", list(self.policy.sizes),
                    time.perf_counter() - start)

    def _run(self, step: StepInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.fn(self.model, step.input_ids, step.positions, step.slot_mapping, step.block_tables,
                       step.context_lens, step.state_slots, step.cu_seqlens, self.num_drafts, self.block_size)

    @torch.inference_mode()
    def __call__(self, seqs: Seq[Sequence], drafts: Seq[Seq[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The round of ``seqs`` (their blocks reserved) with ``drafts``: ``(num_accepted, tokens, drafts)`` of the
        live rows, on the device; compiled outputs are valid until the next round."""
        n, k = len(seqs), len(drafts[0])
        pad_to = None
        if self.compiled and self.policy.covers(n) and k == self.num_drafts:
            pad_to = self.policy.bucket_for(n)
        step = pack_verify_step(seqs, drafts, self.block_size, self.device, pad_to, table_width=self.table_width)
        if pad_to is None:  # eagerly: past the buckets, or fewer drafts than the graphs were compiled for
            accepted, tokens, new = greedy_round(self.model, step.input_ids, step.positions, step.slot_mapping,
                                                 step.block_tables, step.context_lens, step.state_slots,
                                                 step.cu_seqlens, k, self.block_size)
        else:
            with torch.compiler.set_stance("fail_on_recompile"):
                accepted, tokens, new = self._run(step)
        return accepted[:n], tokens[:n], new[:n]
