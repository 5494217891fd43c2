"""Speculative decoding with the checkpoint's MTP layer: what one round computes on the device, and how its steps are
packed (compiled_engine/mtp.py is the layer; Runtime.verify/accept/advance run a round; LLMEngine schedules it).

A round for a sequence of length L (tokens t_0..t_{L-1}, the last one not computed yet) holding k drafts d_1..d_k:

1. verify (``pack_verify_step``): the target scores t_{L-1}, d_1..d_k at positions L-1..L-1+k in one step
   (``StepInputs.speculative``): attention layers write KV for every position (rejected ones are overwritten by
   later steps: attention never reads past a sequence's length), linear layers leave their pools as they are and
   keep what each position adds to the state apart (compiled_engine/gated_deltanet.py). Logits
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

A round (the engine's common case: no min_tokens suppression, no logprobs) is one function, ``fused_round``:
verify, each row's draw (the argmax, or ``ce::sample``'s for sampled rows: compiled_engine/rejection_sampler.py
says why that is the acceptance rule), acceptance, commit and drafts, with nothing read on the host.
It runs eagerly (ModelExecutor.fused_round), or compiled by ``SpeculativeRound`` (``torch.compile(fullgraph=True)``
of ``fused_round_packed``: the step's fields and the rows' sampling parameters in one buffer; one variant
that draws the argmax, one that samples; on a single CUDA rank each (bucket, variant) call captured into a CUDA graph
of the round's own), the batch padded to its bucket with null rows (the null slot, the null block). A compiled round
also writes its results into host memory from inside the graph, so that the host reads them with no copy
(``RoundResults``). Rounds that suppress stop tokens (min_tokens) or return logprobs run the unfused path
(``Runtime.verify``, the rejection sampler, ``Runtime.accept``).

The MTP layer's KV shares the target's blocks. A round writes at most positions L-1..L+2k-2; blocks for the
verified positions are guaranteed by the scheduler, those for the draft positions beyond them are taken when free
(else those entries land in the null block: they only serve this round's later drafts, so the drafts get worse,
never the output).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Sequence as Seq

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from compiled_engine.model import HybridModel
from compiled_engine.sequence import Sequence
from compiled_engine.step import pack_step
from graphs.buckets import BucketPolicy
from graphs.decode_graph import private_copy, raise_recompile_limit, register_inductor_fallbacks
from graphs.static_inputs import host_visible
from ops.argmax import argmax_op
from ops.layouts import verify_cu_seqlens
from ops.library import NULL_BLOCK, NULL_SLOT, OPS, prepare_device
from ops.sample import sample_op
from ops.step import SamplingInputs, StepInputs

if TYPE_CHECKING:
    from compiled_engine.block_tables import BlockTables

logger = logging.getLogger(__name__)
_round_ids = itertools.count()


@dataclass
class SpeculativeStep:
    """A step of speculative decoding between its target forward and its drafts: the sequences, the packed step (a
    prompt step: padded to its captured key), the target's hidden states of every row of it
    ``[T, H]``, (a prefill step) each sequence's computed-token count before the step, its tokens in it, the step's
    fp32 logits (a prefill step's: of each sequence's last row; a verify step's: of every row), and (a prefill step)
    which sequences it computed completely."""

    seqs: list[Sequence]
    step: StepInputs | None  # None: a compiled round (its step stayed inside SpeculativeRound)
    hidden: torch.Tensor | None
    starts: list[int] | None  # a prefill step's (draft_after_prefill reads them); None: a verify round
    counts: list[int]
    logits: torch.Tensor | None
    completed: list[bool] | None = None
    bucket: int | None = None  # a compiled round's bucket
    sampled: bool = False  # a fused round whose rows draw with ce::sample
    sampling: tuple[torch.Tensor, ...] | None = None  # an eager sampled round's ce::sample parameters, on the device
    # A fused round packed with chain_rounds: the tokens each sequence's block table covered when its step was
    # packed; a chained round (``Runtime.chain_round``) reuses that table, so its positions must stay below it.
    table_tokens: list[int] | None = None


@dataclass
class RoundResults:
    """A round's results for its N sequences: ``num_accepted [N]``, ``tokens [N, k+1]`` and ``drafts [N, k]`` on the
    device, and ``rows()``, the same on the host. A compiled round's (``SpeculativeRound.round_results``) are the
    graph's buffers and the host rows it wrote itself: valid until the next round, which overwrites them."""

    num_accepted: torch.Tensor
    tokens: torch.Tensor
    drafts: torch.Tensor
    host: np.ndarray | None = None  # [N, 2k+2]: the rows a compiled round wrote to host memory (None: eager)
    ready: torch.cuda.Event | None = None  # recorded after that round (CUDA): ``host`` holds its rows once passed

    def rows(self) -> list[list[int]]:
        """One row a sequence, ``[a, t_0..t_k, d_1..d_k]`` (num_accepted | tokens | drafts), the round's one
        read-back: a compiled round's host rows once the round is done (no copy), else the device tensors copied."""
        if self.host is None:
            return torch.cat([self.num_accepted[:, None], self.tokens, self.drafts], dim=1).tolist()
        if self.ready is not None:
            self.ready.synchronize()
        return self.host.tolist()


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


class DraftScript:
    """Drafts fixed by position, in place of the MTP layer's: ``tokens[slot, p]`` is the draft for position p of the
    sequence in state slot ``slot``, -1 where the MTP layer's draft stands. Tests and the bench's forced-acceptance
    drafter (bench/spec.py) script a request's drafts here (``LLMEngine.draft_script``): a table on the device, read
    inside a round, so rounds with scripted drafts chain as the MTP layer's do, where a host override
    (``LLMEngine.draft_override``) needs each round read back first. The MTP layer still runs, so a round costs what
    it costs with the layer's drafts. One rank only (speculative_config ``scripted_drafts``)."""

    def __init__(self, num_slots: int, max_model_len: int, num_drafts: int, device: torch.device):
        # A draft may be for a position up to max_model_len + k (a round at the length limit); columns past the table's
        # last are clamped to it, which nothing scripts.
        self.tokens = torch.full((num_slots, max_model_len + num_drafts + 2), -1, dtype=torch.long, device=device)

    def write(self, slot: int, drafts: Seq[int]) -> None:
        """Script the sequence in ``slot``: ``drafts[p]`` (-1: the MTP layer's) for each position p it covers; the
        MTP layer's drafts past it."""
        width = self.tokens.shape[1] - 1  # the last column stays -1: where clamped positions land
        if not NULL_SLOT < slot < self.tokens.shape[0]:  # the null slot is row 0: padding rows read it
            raise ValueError(f"state slot {slot} is not a sequence's (1..{self.tokens.shape[0] - 1})")
        if len(drafts) > width:
            raise ValueError(f"a draft script covers at most {width} positions, got {len(drafts)}")
        row = torch.full((self.tokens.shape[1],), -1, dtype=torch.long)
        row[: len(drafts)] = torch.as_tensor(list(drafts), dtype=torch.long)
        self.tokens[slot].copy_(row)  # a synchronous copy: scripts serve tests and benchmarks, written per prompt chunk

    def apply(self, drafts: torch.Tensor, slots: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
        """``drafts [D, k]`` (the MTP layer's) with each scripted one replaced: row n drafts for positions ``first[n]
        ..first[n] + k - 1`` of the sequence in state slot ``slots[n]``."""
        width = self.tokens.shape[1]
        columns = (first[:, None] + torch.arange(drafts.shape[1], device=drafts.device)).clamp(max=width - 1)
        scripted = self.tokens.view(-1)[slots.long()[:, None] * width + columns]
        return torch.where(scripted >= 0, scripted, drafts)


def draft(
    model: HybridModel,
    step: StepInputs,
    hidden: torch.Tensor,
    next_ids: torch.Tensor,
    rows: torch.Tensor,
    seq_rows: torch.Tensor,
    num_drafts: int,
    block_size: int,
    draft_vocab: int | None = None,
    script: DraftScript | None = None,
) -> torch.Tensor:
    """Greedy drafts ``[len(rows), num_drafts]`` int64, on the device (no host sync).

    The MTP layer runs over every row of ``step`` with ``hidden`` (the target's, ``[T, H]``) and ``next_ids`` (each
    row's next token, ``[T]``), writing its KV there; ``rows`` are the rows to draft from (one per drafting sequence)
    and ``seq_rows`` their sequences' rows of ``step.block_tables``. Each further draft is a one-row MTP decode step
    at the next position, on the previous step's output. ``draft_vocab``: drafts among the first that many token ids
    (SpeculativeConfig.draft_vocab_size; None: all). ``script``: its drafts replace the layer's where it has them
    (row ``rows[n]`` at position p holds the token before the next one, so its drafts are for p + 2 onwards)."""
    out = model.mtp_forward(next_ids, hidden, step)
    if rows.numel() == 0:  # only middle chunks of prompts: their MTP KV is all this step needed
        return rows.new_empty((0, num_drafts))
    h = out[rows]
    tokens = model.draft_tokens(h, draft_vocab)
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
            tokens = model.draft_tokens(h, draft_vocab)
            drafts.append(tokens)
    drafts = torch.stack(drafts, dim=1)
    if script is not None:
        drafts = script.apply(drafts, step.state_slots[seq_rows], step.positions[rows] + 2)
    return drafts


def accept_drafts(drafts: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``drafts`` ``[N, k]``, ``targets`` ``[N, k+1]`` (each verified row's draw) -> ``(num_accepted [N] int64,
    tokens [N, k+1])``: the drafts equal to their rows' draws, up to the first that is not; ``tokens`` are the
    draws: ``tokens[n, :a]`` the accepted drafts, ``tokens[n, a]`` the target's next token (valid ids after it,
    never output). Why that is the rejection rule for greedy drafts: compiled_engine/rejection_sampler.py."""
    k = drafts.shape[1]
    num_accepted = (drafts == targets[:, :k]).long().cumprod(dim=1).sum(dim=1)
    return num_accepted, targets


def successor_fields(
    input_ids: torch.Tensor, positions: torch.Tensor, block_tables: torch.Tensor, state_slots: torch.Tensor,
    num_accepted: torch.Tensor, tokens: torch.Tensor, drafts: torch.Tensor, block_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The verify step of the round after a round, computed on the device from that round's step (``input_ids``,
    ``positions``: ``[N * (k+1)]``; ``block_tables [N, W]``, ``state_slots [N]``) and results (``num_accepted [N]``,
    ``tokens [N, k+1]``, ``drafts [N, k]``): ``(input_ids, positions, slot_mapping, context_lens)``, the fields that
    change (the tables and state slots stay). Sequence n starts where its accepted run ended, ``positions[n, 0] +
    num_accepted[n] + 1``, with its next token ``tokens[n, num_accepted[n]]`` and its new drafts: what
    ``pack_verify_step`` packs for the same sequences once the host has read the round back and advanced them.
    Padding rows (the null slot) stay as they were. Positions past the table map to the null block: the caller keeps
    every verified position inside it (``SpeculativeStep.table_tokens``), so only draft positions can land there."""
    n, width = tokens.shape[0], block_tables.shape[1]
    live = (state_slots != NULL_SLOT)[:, None]
    old_ids, old_positions = input_ids.view(n, -1), positions.view(n, -1)
    offsets = torch.arange(tokens.shape[1], device=tokens.device)
    new_positions = torch.where(live, old_positions[:, :1] + num_accepted[:, None] + 1 + offsets, old_positions)
    new_ids = torch.where(live, torch.cat([tokens.gather(1, num_accepted[:, None]), drafts], dim=1), old_ids)
    column = new_positions // block_size
    blocks = block_tables.gather(1, column.clamp(max=width - 1)).long()
    blocks = torch.where(column < width, blocks, NULL_BLOCK)
    slots = blocks * block_size + new_positions % block_size
    context_lens = (new_positions[:, -1] + 1).to(torch.int32)
    return new_ids.reshape(-1), new_positions.reshape(-1), slots.reshape(-1), context_lens


def successor_counters(counters: torch.Tensor, state_slots: torch.Tensor, num_accepted: torch.Tensor) -> torch.Tensor:
    """A sampled round's ``ce::sample`` counters (``[N * (k+1)]``: each verified row's output index) for the round
    after it: every row of sequence n moves on by the tokens the sequence emitted, ``num_accepted[n] + 1``; padding
    rows (the null slot) keep theirs."""
    emitted = torch.where(state_slots != NULL_SLOT, num_accepted + 1, 0)
    return (counters.view(num_accepted.shape[0], -1) + emitted[:, None]).reshape(-1)


def fused_round(
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
    draft_vocab: int | None = None,
    sampling: tuple[torch.Tensor, ...] | None = None,
    script: DraftScript | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A whole round, from a verify step's tensors (``pack_verify_step``): the target's verify step, each row's draw
    (the argmax; with ``sampling``, ``ce::sample``'s parameters ``(temperature, top_k, top_p, min_p, seeds,
    counters)`` ``[N * (k+1)]`` each, its draw), acceptance (compiled_engine/rejection_sampler.py), the commit of the
    linear layers' states, and the MTP drafts. Returns ``(num_accepted [N], tokens [N, k+1], drafts [N, k])`` as
    ``Runtime.verify``, the rejection sampler and ``Runtime.accept`` do; nothing is read on the host (the traced
    function of ``SpeculativeRound``)."""
    step = StepInputs(input_ids, positions, slot_mapping, block_tables, context_lens, state_slots, cu_seqlens,
                      is_prefill=True, speculative=True)
    n, k = state_slots.shape[0], num_drafts
    hidden = model(step)
    logits = model.decode_logits(hidden)
    targets = (argmax_op(logits) if sampling is None else sample_op(logits, *sampling)).view(n, k + 1)
    accepted, tokens = accept_drafts(input_ids.view(n, k + 1)[:, 1:], targets)
    return accepted, tokens, commit_and_draft(model, step, hidden, accepted, tokens, block_size, draft_vocab, script)


def commit_and_draft(model: HybridModel, step: StepInputs, hidden: torch.Tensor, num_accepted: torch.Tensor,
                     tokens: torch.Tensor, block_size: int, draft_vocab: int | None = None,
                     script: DraftScript | None = None) -> torch.Tensor:
    """After a verify ``step`` (the target's ``hidden`` states of its rows) and acceptance: each linear layer's
    state pools take the state after each sequence's last accepted position, then the MTP layer drafts from the
    target's next token (``tokens[n, num_accepted[n]]``; ``script``'s drafts where it has them). Returns the drafts
    ``[N, k]`` on the device."""
    n, k = tokens.shape[0], tokens.shape[1] - 1
    index = torch.arange(n, device=tokens.device)
    model.commit_verify(step.state_slots, num_accepted)
    return draft(model, step, hidden, tokens.reshape(-1), index * (k + 1) + num_accepted, index, k, block_size,
                 draft_vocab, script)


class _PackedLayout(NamedTuple):
    """Where the fields of a compiled round's step sit in its int64 buffer (``SpeculativeRound``): ``input_ids``
    at 0, ``positions`` and ``slot_mapping`` (``batch * (k+1)`` rows each, from even offsets: 16-byte aligned), then
    the int32 fields, read through an int32 view of the buffer (so that the graph converts nothing): ``context_lens``
    at 0 of that view, ``state_slots`` and ``block_tables [batch, table_width]`` at multiples of 4. A sampled round's
    ``ce::sample`` parameters follow: ``top_k | seeds | counters`` (int64), then ``temperature | top_p | min_p``
    through a float32 view, a row each of the ``batch * (k+1)`` verified rows."""

    rows: int  # batch * (k+1)
    row_stride: int  # int64 elements from one per-row field to the next (rows, rounded up to even)
    narrow: int  # where the int32 view starts (int64 elements)
    state_slots: int  # int32 elements into the view
    block_tables: int
    end: int  # the step's length, int64 elements
    sampling: int  # where the sampling parameters start (int64 elements)
    float_stride: int  # float32 elements from one float field to the next (rows, rounded up to a multiple of 4)
    sampled_end: int  # the length with them


def _packed_layout(batch: int, num_drafts: int, table_width: int) -> _PackedLayout:
    rows = batch * (num_drafts + 1)
    stride = rows + rows % 2
    per_field = batch + (-batch) % 4
    narrow = 2 * per_field + batch * table_width
    end = 3 * stride + -(-narrow // 2)
    sampling = end + end % 2
    per_float = rows + (-rows) % 4
    return _PackedLayout(rows, stride, 3 * stride, per_field, 2 * per_field, end, sampling, per_float,
                         sampling + 3 * stride + 3 * per_float // 2)


def _step_views(buffer, layout: _PackedLayout, batch: int, table_width: int, int32) -> tuple:
    """The step's fields as views of ``buffer`` (a torch tensor or a numpy array; ``int32``: that library's dtype):
    ``(input_ids, positions, slot_mapping, block_tables, context_lens, state_slots)``, the last three int32."""
    rows, stride = layout.rows, layout.row_stride
    narrow = buffer[layout.narrow : layout.end].view(int32)
    tables = narrow[layout.block_tables : layout.block_tables + batch * table_width].reshape(batch, table_width)
    return (buffer[:rows], buffer[stride : stride + rows], buffer[2 * stride : 2 * stride + rows], tables,
            narrow[:batch], narrow[layout.state_slots : layout.state_slots + batch])


def _sampling_views(buffer, layout: _PackedLayout, float32) -> tuple:
    """A sampled round's parameters as views of ``buffer`` (a torch tensor or a numpy array; ``float32``: that
    library's dtype), in ``ce::sample``'s order: ``(temperature, top_k, top_p, min_p, seeds, counters)``."""
    rows, stride, at = layout.rows, layout.row_stride, layout.sampling
    top_k, seeds, counters = (buffer[at + i * stride : at + i * stride + rows] for i in range(3))
    floats = buffer[at + 3 * stride : layout.sampled_end].view(float32)
    temperature, top_p, min_p = (floats[i * layout.float_stride : i * layout.float_stride + rows] for i in range(3))
    return temperature, top_k, top_p, min_p, seeds, counters


def unpack_verify_fields(
    packed: torch.Tensor, batch: int, num_drafts: int, table_width: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fields of a verify step packed by ``pack_verify_into`` (``_packed_layout``), as views of ``packed``:
    ``(input_ids, positions, slot_mapping, block_tables, context_lens, state_slots)``, the last three int32."""
    return _step_views(packed, _packed_layout(batch, num_drafts, table_width), batch, table_width, torch.int32)


def unpack_sampling_fields(packed: torch.Tensor, batch: int, num_drafts: int, table_width: int) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A sampled round's ``ce::sample`` parameters packed by ``pack_sampling_into``, as views of ``packed``, in the
    op's order: ``(temperature, top_k, top_p, min_p, seeds, counters)``, a row each of the ``batch * (k+1)`` rows."""
    return _sampling_views(packed, _packed_layout(batch, num_drafts, table_width), torch.float32)


def pack_sampling_into(out: np.ndarray, sampling: SamplingInputs | None, num_rows: int, bucket: int, num_drafts: int,
                       table_width: int) -> int:
    """``sampling``'s ``[num_rows]`` fields (host tensors) written into ``out`` where ``unpack_sampling_fields``
    reads them, every other row of the bucket a greedy padding row (temperature 0, every filter off; None: every
    row); returns the layout's length with them."""
    layout = _packed_layout(bucket, num_drafts, table_width)
    n = 0 if sampling is None else num_rows
    targets = _sampling_views(out, layout, np.float32)
    if sampling is not None:
        values = (sampling.temperature, sampling.top_k, sampling.top_p, sampling.min_p, sampling.seeds,
                  sampling.counters)
        for target, value in zip(targets, values):
            target[:n] = value.numpy()
    for target, pad in zip(targets, (0.0, 0, 1.0, 0.0, 0, 0)):  # greedy, every filter off, seed and counter 0
        target[n:] = pad
    return layout.sampled_end


def fused_round_packed(
    model: HybridModel, packed: torch.Tensor, results: torch.Tensor, batch: int, num_drafts: int, block_size: int,
    table_width: int, draft_vocab: int | None, sample: bool, script: DraftScript | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``fused_round`` on the fields of a verify step of ``batch`` sequences packed into one int64 buffer
    (``_packed_layout``) and, when ``sample`` (a Python bool: each value is a graph of its own), the ``ce::sample``
    parameters of its ``batch * (k+1)`` rows packed after them: the function a compiled round traces. One buffer at
    a fixed address is the whole input of the captured graph, written by one copy a round; the fields are views of
    it (``unpack_verify_fields``, ``unpack_sampling_fields``: no kernel), and the verify step's ``cu_seqlens`` (k+1
    rows a sequence) computed in the graph. Returns ``fused_round``'s outputs, and writes them into the first
    ``batch`` rows of ``results`` (int64 ``[>= batch, 2k+2]``: num_accepted | tokens | drafts; host memory on a GPU,
    so that a replay leaves them where the host reads them). Then writes the step of the round after it into
    ``packed`` (``successor_fields``; a sampled round's counters too, ``successor_counters``: what a chained round
    reads)."""
    fields = unpack_verify_fields(packed, batch, num_drafts, table_width)
    sampling = unpack_sampling_fields(packed, batch, num_drafts, table_width) if sample else None
    accepted, tokens, drafts = fused_round(
        model,
        *fields,
        verify_cu_seqlens(batch, num_drafts + 1, packed.device),
        num_drafts,
        block_size,
        draft_vocab,
        sampling,
        script,
    )
    # Plain in-place writes of a graph input: Inductor stores these rows straight into ``results`` (no copy of it),
    # so the captured graph itself writes the host memory; and the next round's step into ``packed``, where a
    # chained round (``SpeculativeRound.run_chained``) reads it with nothing from the host.
    results[:batch].copy_(torch.cat([accepted[:, None], tokens, drafts], dim=1))
    input_ids, positions, slot_mapping, block_tables, context_lens, state_slots = fields
    successor = successor_fields(input_ids, positions, block_tables, state_slots, accepted, tokens, drafts, block_size)
    for field, value in zip((input_ids, positions, slot_mapping, context_lens), successor):
        field.copy_(value)
    if sampling is not None:
        counters = sampling[5]
        counters.copy_(successor_counters(counters, state_slots, accepted))
    return accepted, tokens, drafts


def pack_verify_into(
    out: np.ndarray, seqs: Seq[Sequence], drafts: Seq[Seq[int]], block_size: int, bucket: int, num_drafts: int,
    table_width: int, block_tables: BlockTables | None = None,
) -> int:
    """``pack_verify_step(seqs, drafts, ..., pad_to=bucket, table_width=table_width)``'s fields written straight into
    ``out`` (int64) in a compiled round's layout (``_packed_layout``), padding rows included; returns the layout's
    length. The round's host work at batch 1 is on the critical path (a round reads its tokens back before the next
    is packed), so this skips pack_step's intermediate buffer and the field-by-field staging after it.
    ``block_tables``: the tables kept by slot (CacheManager.block_tables), read instead of each sequence's list."""
    k, n = num_drafts, len(seqs)
    layout = _packed_layout(bucket, k, table_width)
    ids, positions, slots, tables, context_lens, state_slots = _step_views(out, layout, bucket, table_width, np.int32)
    starts = np.zeros(bucket, dtype=np.int64)
    starts[:n] = [seq.num_computed_tokens for seq in seqs]
    positions[:] = (starts[:, None] + np.arange(k + 1, dtype=np.int64)).reshape(-1)  # padding rows: 0..k
    ids = ids.reshape(bucket, k + 1)
    ids[n:] = 0
    tables[n:] = NULL_BLOCK  # every padding row's
    if block_tables is not None:
        tables[:n] = block_tables.rows(seqs, table_width)
    else:
        tables[:n] = NULL_BLOCK  # past each sequence's blocks
        for i, seq in enumerate(seqs):
            tables[i, : len(seq.block_table)] = seq.block_table
    for i, (seq, draft) in enumerate(zip(seqs, drafts)):
        ids[i, 0] = seq.token_ids[seq.num_computed_tokens]
        ids[i, 1:] = draft
    blocks = np.take_along_axis(tables, (positions // block_size).reshape(bucket, k + 1), axis=1).astype(np.int64)
    slots[:] = (blocks * block_size).reshape(-1) + positions % block_size
    context_lens[:] = starts + k + 1
    state_slots[:] = NULL_SLOT
    state_slots[:n] = [seq.state_slot for seq in seqs]
    return layout.end


class SpeculativeRound:
    """Compiled rounds: ``fused_round_packed`` under ``torch.compile(fullgraph=True)`` (Inductor's code, no cudagraph
    trees), one graph per bucket of sequences and variant (rows draw their argmax; rows draw with ``ce::sample``).
    Every bucket is compiled at ``warmup`` in both variants on padding rows only (the null slot and block: live
    sequences keep their state), largest first; later rounds run under ``fail_on_recompile``. With ``capture`` (CUDA)
    each compiled call is also captured into a ``torch.cuda.CUDAGraph`` of its own (one memory pool for all), as the
    decode runner does (graphs/decode_graph.py): a round is then the host writing its packed step (and its rows'
    sampling parameters when it samples) into a pinned staging buffer and one ``graph.replay()`` (~0.3 ms of host
    time less than a cudagraph-trees replay), the graph's first node the copy of the staging buffer into the buffer
    it reads. A round is ``load`` (this rank's buffers) then ``run``; between the two a
    tensor-parallel rank 0 broadcasts ``buffers`` (compiled_engine/executor.py). ``round_results`` then gives the
    round's results, which the graph also wrote to host memory (``results``): reading them back needs no copy.
    ``run_chained`` runs the round after the last one from the step that round's graph wrote (one more graph per
    bucket and variant, without the staging copy), ``keep`` first saving the last round's host rows from it.
    Tensor-parallel workers run the same graphs, each writing its own process's results buffer, which nothing reads.
    """

    VARIANTS = (False, True)  # the ``sample`` values that get graphs

    def __init__(self, model: HybridModel, num_drafts: int, block_size: int, max_num_seqs: int, max_model_len: int,
                 device: torch.device, capture: bool, draft_vocab: int | None = None,
                 script: DraftScript | None = None):
        self.model = model
        self.draft_vocab = draft_vocab
        self.script = script  # read by the graphs in place: the engine writes a request's row before its rounds
        # Block tables of one width: up to the furthest verified position.
        self.table_width = -(-(max_model_len + num_drafts) // block_size)
        self.num_drafts = num_drafts
        self.block_size = block_size
        self.device = device
        self.policy = BucketPolicy.create(max_num_seqs)
        self.captured = capture
        # (bucket, sample) -> (its CUDA graph, the outputs it writes): filled by warmup when capturing.
        self._graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}
        register_inductor_fallbacks(OPS)
        raise_recompile_limit(2 * len(self.VARIANTS) * len(self.policy))
        # Its own code object: Dynamo counts recompiles per code object, so each instance's buckets count alone.
        self.fn = torch.compile(private_copy(fused_round_packed, f"round{next(_round_ids)}"), fullgraph=True)
        size = _packed_layout(self.policy.max_size, num_drafts, self.table_width).sampled_end
        self.packed = torch.zeros(size, dtype=torch.long, device=device)  # the graphs' input: step and sampling
        # What the graphs write of a round: a row a sequence of the bucket, num_accepted | tokens (k+1) | drafts (k),
        # in host memory that the graph writes directly on a GPU (``host_visible``), read there by ``round_results``.
        host_results, self.results = host_visible((self.policy.max_size, 2 * num_drafts + 2), device)
        self._host_results = host_results.numpy()
        if capture:
            # Fixed addresses the graphs read or write in place
            for buffer in (self.packed, self.results, *([script.tokens] if script is not None else [])):
                torch._dynamo.mark_static_address(buffer)
        # Host staging, written through a numpy view made once (every torch call here is host time on the round's
        # critical path). Pinned when capturing: each captured graph copies it into ``packed`` as its first node, so
        # the host's whole work to launch a round is writing it and the replay.
        self._stage = torch.zeros(size, dtype=torch.long, pin_memory=capture)
        self._stage_np = self._stage.numpy()
        # Recorded after each round (CUDA): its results are in host memory, and the staging buffer is free to
        # write again, once it has passed.
        self._done = torch.cuda.Event() if device.type == "cuda" else None
        # Chained rounds (``run_chained``): (bucket, sample) -> the graph without the staging copy, and two
        # host buffers (``host_visible``: a kernel writes them on a GPU), used in turn, where a round's rows are kept
        # before the chained round after it overwrites ``results`` (``keep``), each with the event recorded after
        # its copy.
        self._chained: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}
        self._kept = [host_visible(self.results.shape, device) for _ in range(2)]
        self._kept_ready = [torch.cuda.Event() if device.type == "cuda" else None for _ in range(2)]
        self._next_kept = 0

    @property
    def captured_buckets(self) -> tuple[int, ...]:
        """The buckets with a CUDA graph of the round's own in every variant, after warmup (CUDA only)."""
        buckets = {bucket for bucket, _ in self._graphs}
        return tuple(sorted(b for b in buckets if all((b, v) in self._graphs for v in self.VARIANTS)))

    def covers(self, num_seqs: int, num_drafts: int) -> bool:
        """Whether a round of ``num_seqs`` sequences with ``num_drafts`` drafts each has graphs (else it runs
        eagerly: past the buckets, or fewer drafts than the graphs were compiled for)."""
        return self.policy.covers(num_seqs) and num_drafts == self.num_drafts

    @torch.inference_mode()
    def warmup(self, progress: bool = False) -> None:
        """Compile (and capture) every bucket in every variant, largest first. ``progress``: a progress bar over the
        buckets (stderr)."""
        start = time.perf_counter()
        prepare_device(self.device)  # the kernels' per-device buffers, outside every graph's memory pool
        pool = torch.cuda.graph_pool_handle() if self.captured else None
        what = "compiling and capturing" if self.captured else "compiling"
        for bucket in tqdm(reversed(self.policy.sizes), total=len(self.policy), desc=f"{what} speculative rounds",
                           unit="bucket", disable=not progress):
            self._pack([], [], None, bucket)  # every row padding: the null slot and block, greedy rows
            pack_sampling_into(self._stage_np, None, 0, bucket, self.num_drafts, self.table_width)
            self._upload(self._length(bucket, True))
            for sample in self.VARIANTS:
                for _ in range(2):  # compile, Triton's JIT and autotuning: none of it may happen inside a capture
                    self._call(bucket, sample)
                if self.captured:
                    torch.cuda.synchronize(self.device)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool), torch.compiler.set_stance("fail_on_recompile"):
                        self._upload(self._length(bucket, sample))
                        outputs = self._call(bucket, sample)
                    self._graphs[bucket, sample] = (graph, outputs)
                    graph.replay()
                    self._done.record()  # the next bucket's _pack waits for the replay's copy of the staging buffer
                    # The chained round: the same call, its step already in the packed buffer.
                    chained = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(chained, pool=pool), torch.compiler.set_stance("fail_on_recompile"):
                        outputs = self._call(bucket, sample)
                    self._chained[bucket, sample] = (chained, outputs)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        logger.info("compiled speculative rounds%s: buckets %s in %.1f s", " and captured" if self.captured else "",
                    list(self.policy.sizes), time.perf_counter() - start)

    def _call(self, bucket: int, sample: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.fn(self.model, self.packed, self.results, bucket, self.num_drafts, self.block_size,
                       self.table_width, self.draft_vocab, sample, self.script)

    def _length(self, bucket: int, sample: bool) -> int:
        """How much of the packed buffer a round of ``bucket`` reads: the step, and the sampling rows when it
        samples."""
        layout = _packed_layout(bucket, self.num_drafts, self.table_width)
        return layout.sampled_end if sample else layout.end

    def _pack(self, seqs: Seq[Sequence], drafts: Seq[Seq[int]], sampling: SamplingInputs | None, bucket: int,
              block_tables: BlockTables | None = None) -> int:
        """The verify step of ``seqs`` padded to ``bucket``, and ``sampling`` (when given) with greedy padding rows,
        written into the host staging buffer once the last round is done with it (``pack_verify_into``,
        ``pack_sampling_into``); returns their length."""
        if self.captured:
            self._done.synchronize()  # the last round has copied the staging buffer (its graph's first node)
        length = pack_verify_into(self._stage_np, seqs, drafts, self.block_size, bucket, self.num_drafts,
                                  self.table_width, block_tables)
        if sampling is None:
            return length
        return pack_sampling_into(self._stage_np, sampling, len(seqs) * (self.num_drafts + 1), bucket,
                                  self.num_drafts, self.table_width)

    def _upload(self, length: int) -> None:
        """The staged step (``_pack``'s ``length`` elements) into the packed buffer, in one copy (asynchronous when
        the staging buffer is pinned: ``run`` records the event ``_pack`` waits for after it)."""
        self.packed[:length].copy_(self._stage[:length], non_blocking=True)

    def pack(self, seqs: Seq[Sequence], drafts: Seq[Seq[int]], sampling: SamplingInputs | None = None,
             block_tables: BlockTables | None = None) -> tuple[int, int]:
        """The verify step of ``seqs`` (``covers`` them) and ``sampling`` (the ``ce::sample`` parameters of their
        ``len(seqs) * (k+1)`` verified rows, host tensors; None: argmax rows), staged on the host for ``load``: its
        length and bucket. ``block_tables``: the tables kept by slot, read instead of each sequence's list."""
        bucket = self.policy.bucket_for(len(seqs))
        return self._pack(seqs, drafts, sampling, bucket, block_tables), bucket

    def load(self, length: int) -> None:
        """``pack``'s staged round (``length`` elements) into this rank's buffer; nothing when the rounds are
        captured: each graph copies the staging buffer itself."""
        if not self.captured:
            self._upload(length)

    def buffers(self, bucket: int, sample: bool) -> list[torch.Tensor]:
        """What a round of ``bucket`` reads: the packed step, with the sampling rows when it samples."""
        return [self.packed[: self._length(bucket, sample)]]

    @torch.inference_mode()
    def run(self, bucket: int, sample: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The loaded round: ``(num_accepted, tokens, drafts)`` of every row of the bucket, on the device (the
        graphs' outputs: valid until the next round); the same rows in ``results`` once the round is done."""
        captured = self._graphs.get((bucket, sample))
        if captured is not None:
            graph, outputs = captured
            graph.replay()
        else:
            if self.captured:  # before warmup: the staged round is not in the packed buffer yet
                self._upload(self._length(bucket, sample))
            with torch.compiler.set_stance("fail_on_recompile"):
                outputs = self._call(bucket, sample)
        if self._done is not None:
            self._done.record()
        return outputs

    def keep(self, results: RoundResults) -> RoundResults:
        """``results`` (the last round's ``round_results``) read from a copy of their host rows, made after that round
        and before anything queued after this call: a chained round overwrites ``results`` when it ends, possibly
        while the host still reads the round before it."""
        if results.host is None:  # an eager round's: device tensors of its own
            return results
        slot, self._next_kept = self._next_kept, 1 - self._next_kept
        n = len(results.host)
        (kept, seen), ready = self._kept[slot], self._kept_ready[slot]
        if ready is None:  # on the CPU the round is done: copy now
            kept[:n] = torch.from_numpy(results.host)
        else:
            # A kernel writes the rows from the round's device outputs, as the round's graph writes ``results``: a
            # copy between two pinned host buffers (cudaMemcpyAsync host to host) runs synchronously with the host,
            # which would wait there for the round in flight, so the next round could not launch ahead of it.
            torch.cat([results.num_accepted[:, None], results.tokens, results.drafts], dim=1, out=seen[:n])
            ready.record()
        return dataclasses.replace(results, host=kept[:n].numpy(), ready=ready)

    @torch.inference_mode()
    def run_chained(self, bucket: int, sample: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The round after the last round of ``bucket`` and variant ``sample``, on the same sequences: its step (and
        sampling counters) are what that round wrote into the packed buffer (``successor_fields``,
        ``successor_counters``), so nothing comes from the host; as ``run`` otherwise."""
        captured = self._chained.get((bucket, sample))
        if captured is not None:
            graph, outputs = captured
            graph.replay()
        else:
            with torch.compiler.set_stance("fail_on_recompile"):
                outputs = self._call(bucket, sample)
        if self._done is not None:
            self._done.record()
        return outputs

    def round_results(self, outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor], num_seqs: int) -> RoundResults:
        """The results of the round ``run`` just queued (``outputs``: what it returned) for its first ``num_seqs``
        sequences, the bucket's padding rows left out: the device outputs, and the host rows the round writes,
        there once the event ``run`` recorded after the round's work has passed."""
        accepted, tokens, drafts = (t[:num_seqs] for t in outputs)
        return RoundResults(accepted, tokens, drafts, self._host_results[:num_seqs], self._done)
