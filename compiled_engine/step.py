"""Packing a step: the sequences' next tokens, positions, KV slots, block tables and state slots as one
``ops.step.StepInputs`` on the device (``pack_step``), and the one way the step path copies host tensors to the
device (``upload``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence as Seq

import numpy as np
import torch

from ops.delta_rule import host_chunk_indices
from ops.library import NULL_BLOCK, NULL_SLOT
from ops.step import StepInputs

if TYPE_CHECKING:
    from compiled_engine.block_tables import BlockTables
    from compiled_engine.sequence import Sequence


_ALIGN = 16  # bytes: the alignment Triton specialises pointer arguments on


def _offsets(sizes: list[int], multiple: int) -> list[int]:
    """Start of each field, every start rounded up to ``multiple`` elements, then the total length."""
    starts, end = [], 0
    for size in sizes:
        end = -(-end // multiple) * multiple
        starts.append(end)
        end += size
    return starts + [end]


def upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor on ``device`` without waiting for the GPU: on CUDA a copy from pageable memory waits for
    the stream to drain (stalling the host and undoing any overlap), so it goes through pinned memory,
    asynchronously. Every host -> device copy of the step path goes through here."""
    if device.type == "cuda":
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def upload_fields(fields: Seq[Seq[int | float]], dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """The ``fields`` (lists of numbers) on ``device`` in one ``upload``, each a view starting on a 16-byte boundary:
    a field at an offset that depended on the others' lengths would give the Triton kernels that read it a new
    pointer alignment, so a new compiled variant, as the batch size changed."""
    multiple = _ALIGN // torch.empty((), dtype=dtype).element_size()
    flat, at = [], []
    for values in fields:
        flat.extend([0] * (-len(flat) % multiple))
        at.append(len(flat))
        flat.extend(values)
    packed = upload(torch.tensor(flat, dtype=dtype), device)
    return [packed[begin : begin + len(values)] for begin, values in zip(at, fields)]


def decode_lane_count(decode_rows: int, key: tuple[int, int, int] | None = None) -> int:
    """The decode lanes of a prefill step with ``decode_rows`` leading decode rows: its captured ``key``'s (graphs/
    prefill_graph.py), or, eager, its decode rows rounded up to a multiple of 4, padding ones after them: the prompt
    part's int32 state slots then start on a 16-byte boundary, as every field does (see ``pack_step``), whatever the
    step's decode rows."""
    if key is not None:
        return key[2]
    return -(-decode_rows // (_ALIGN // 4)) * (_ALIGN // 4)


class PaddingSequence:
    """What ``pack_step`` reads of a sequence, for a step's padding: ``n`` token ids 0 on the null block and the null
    slot, none computed. Its results land where no sequence reads (the memory plan's start-up steps, the padding of
    a captured prompt step: graphs/prefill_graph.py)."""

    def __init__(self, n: int, block_size: int):
        self.token_ids = [0] * n
        self.num_computed_tokens = 0
        self.block_table = [NULL_BLOCK] * -(-n // block_size)
        self.state_slot = NULL_SLOT


def pack_step(
    seqs: Seq["Sequence"], counts: Seq[int], is_prefill: bool, block_size: int, device: torch.device,
    chunk_rows: int | None = None, tables: BlockTables | None = None, decode_rows: int = 0,
) -> StepInputs:
    """The StepInputs of computing the next ``counts[i]`` tokens of each sequence (its blocks already reserved).
    ``chunk_rows``: a prefill step's chunk table padded to that many rows (``host_chunk_indices``' skip rows).
    ``tables``: the block tables kept by slot (CacheManager.block_tables), read instead of each sequence's list.
    ``decode_rows``: a prefill step's leading sequences of one token each (``Runtime.build_step`` checks them) that
    the linear layers compute as decode rows (``StepInputs.decode_rows``); the chunk table and the int64 offsets are
    then the prompt part's.

    Reads each sequence's tokens, ``num_computed_tokens`` and ``block_table``; changes nothing. Every field is
    packed into one host buffer (an int64 part and an int32 part), moved to ``device`` in a single pinned,
    asynchronous copy; the fields are views of that device tensor. (One ``torch.tensor(..., device="cuda")`` per
    field would be seven copies from pageable memory, each of which waits for the GPU to go idle first.) Each field
    starts on a 16-byte boundary: Triton compiles a kernel variant per pointer alignment, and an offset that depended
    on the step's token or sequence count would compile new variants in the middle of serving.
    """
    starts = [seq.num_computed_tokens for seq in seqs]
    if is_prefill:  # numpy per sequence: a prompt step packs up to max_num_batched_tokens (8,192) tokens
        ids, pos, slots, cu_seqlens = [], [], [], [0]
        for seq, start, n in zip(seqs, starts, counts):
            p = np.arange(start, start + n, dtype=np.int64)
            ids.append(np.asarray(seq.token_ids[start : start + n], dtype=np.int64))
            pos.append(p)
            slots.append(np.asarray(seq.block_table, dtype=np.int64)[p // block_size] * block_size + p % block_size)
            cu_seqlens.append(cu_seqlens[-1] + n)
        input_ids, positions, slot_mapping = (np.concatenate(parts) for parts in (ids, pos, slots))
        prompt_cu_seqlens = [c - decode_rows for c in cu_seqlens[decode_rows:]] if decode_rows else cu_seqlens
        # the delta rule's, on the host: no device sync
        chunks = host_chunk_indices(prompt_cu_seqlens, num_rows=chunk_rows)
    else:  # one token each: the per-sequence loop above, unrolled (this runs every decode step, for up to 256 rows)
        input_ids = [seq.token_ids[start] for seq, start in zip(seqs, starts)]
        positions = starts
        slot_mapping = [seq.block_table[p // block_size] * block_size + p % block_size for seq, p in zip(seqs, starts)]
        cu_seqlens, prompt_cu_seqlens, chunks = [], [], []
    num_seqs, num_tokens = len(seqs), len(input_ids)
    context_lens = [start + n for start, n in zip(starts, counts)]
    state_slots = [seq.state_slot for seq in seqs]
    width = max(len(seq.block_table) for seq in seqs)
    # int64: input_ids | positions | slot_mapping | the prompt part's cu_seqlens (again, for FLA) | chunk indices
    at64 = _offsets([num_tokens, num_tokens, num_tokens, len(prompt_cu_seqlens), len(chunks)], _ALIGN // 8)
    # int32: context_lens | state_slots | cu_seqlens | the prompt part's (with decode rows) | block tables (the null
    # block beyond their end)
    own_prompt = prompt_cu_seqlens if decode_rows else []
    at32 = _offsets([num_seqs, num_seqs, len(cu_seqlens), len(own_prompt), num_seqs * width], _ALIGN // 4)
    # Both in one byte buffer, the int32 part from a 16-byte boundary: one host -> device copy per step.
    bytes64 = -(-at64[-1] * 8 // _ALIGN) * _ALIGN
    packed = np.zeros(bytes64 + at32[-1] * 4, dtype=np.uint8)
    packed64, packed32 = packed[:bytes64].view(np.int64), packed[bytes64:].view(np.int32)
    for begin, values in zip(at64, (input_ids, positions, slot_mapping, prompt_cu_seqlens, chunks)):
        packed64[begin : begin + len(values)] = values
    packed32[:] = NULL_BLOCK
    for begin, values in zip(at32, (context_lens, state_slots, cu_seqlens, own_prompt)):
        packed32[begin : begin + len(values)] = values
    tables_at = at32[4]
    packed_tables = packed32[tables_at : tables_at + num_seqs * width].reshape(num_seqs, width)
    if tables is not None:
        packed_tables[:] = tables.rows(seqs, width)
    else:
        for row, seq in zip(packed_tables, seqs):
            row[: len(seq.block_table)] = seq.block_table
    on_device = upload(torch.from_numpy(packed), device)
    int64, int32 = on_device[:bytes64].view(torch.int64), on_device[bytes64:].view(torch.int32)
    t, n, p = num_tokens, num_seqs, len(prompt_cu_seqlens)
    return StepInputs(
        input_ids=int64[at64[0] : at64[0] + t],
        positions=int64[at64[1] : at64[1] + t],
        slot_mapping=int64[at64[2] : at64[2] + t],
        block_tables=int32[tables_at : tables_at + n * width].view(n, width),
        context_lens=int32[at32[0] : at32[0] + n],
        state_slots=int32[at32[1] : at32[1] + n],
        cu_seqlens=int32[at32[2] : at32[2] + n + 1] if is_prefill else None,
        is_prefill=is_prefill,
        cu_seqlens_long=int64[at64[3] : at64[3] + p] if is_prefill else None,
        chunk_indices=int64[at64[4] : at64[4] + len(chunks)].view(-1, 2) if is_prefill else None,
        decode_rows=decode_rows if is_prefill else 0,
        prompt_cu_seqlens=int32[at32[3] : at32[3] + p] if is_prefill and decode_rows else None,
    )

