"""Static input buffers of the compiled decode step, and the padding lanes.

A CUDA graph replays with the device addresses it was recorded with, so every tensor a decode graph reads must
live at one address for the runtime's whole life. These buffers are allocated once, sized for the largest bucket,
and marked ``torch._dynamo.mark_static_address``: reduce-overhead then reads them in place instead of copying
every non-static input into its own graph-owned buffer at each replay. Each step copies the (unpadded) StepInputs
built by ``Runtime.build_step`` into the first N rows; every other row is a padding lane.

A padding lane touches only the reserved rows (ops/library.py): state slot ``NULL_SLOT``, block table all
``NULL_BLOCK``, KV ``slot_mapping`` row 0 (offset 0 of the null block), ``context_len`` 0 (paged attention returns
zeros for it) and token id 0. The ops never read a padding lane's result back into a live sequence.

Few copies per step: each copy or fill is a kernel launch (a few µs of host time on a GPU, where at large batch
the host is half of a decode step). The six buffers are views of two packed ones, laid out field after field as
``compiled_engine.step_inputs.pack_step`` packs a step into the int64 and int32 parts of its device buffer:

    int64 [3, R]:           input_ids | positions | slot_mapping
    int32 [2 R + R W]:      context_lens | state_slots | block_tables [R, W]

R is ``max_batch`` rounded up to a multiple of 16, so every view starts 16-byte aligned (Inductor's GPU code
assumes aligned inputs and would copy a misaligned one at every call); W is ``max_blocks_per_seq``. The graph only
reads these views, so their sharing two allocations costs nothing (DESIGN.md's "separate allocations" rule is
about buffers a graph mutates). In a packed step the three int64 fields lie at equal distances in one buffer, and
so do context_lens and state_slots in the other: each group is one strided copy, the block table a third. Three
copies per step (four when the input ids come from elsewhere, as the overlapped engine's sampled tokens do), plus
resets only where the previous step left stale rows or columns (the invariant of ``StaticDecodeInputs``), instead
of re-padding every field up to the bucket at every step.
"""

from __future__ import annotations

from typing import Sequence

import torch

from compiled_engine.step_inputs import StepInputs
from ops.library import NULL_BLOCK, NULL_SLOT

PAD_TOKEN_ID = 0
PAD_POSITION = 0
PAD_CONTEXT_LEN = 0
ROW_ALIGN = 16  # rows per field are a multiple of this: 64-byte (int32) and 128-byte (int64) aligned views


class StaticDecodeInputs:
    """Device buffers, one row per lane, for decode batches of up to ``max_batch`` sequences.

    Invariant between calls: rows ``live`` and beyond (``live``: the last step's number of sequences) are padding
    lanes, and every block-table column at or beyond ``width`` (the last step's table width) is the null block.
    So after ``fill`` the first N rows are the step and every other row is a padding lane, whatever bucket the
    graph then reads.
    """

    def __init__(self, max_batch: int, max_blocks_per_seq: int, block_size: int, device: torch.device):
        if max_batch < 1 or max_blocks_per_seq < 1 or block_size < 1:
            raise ValueError(
                f"need max_batch, max_blocks_per_seq, block_size >= 1, got {max_batch}, {max_blocks_per_seq}, {block_size}"
            )
        self.max_batch = max_batch
        self.max_blocks_per_seq = max_blocks_per_seq
        self.device = torch.device(device)
        pad_kv_row = NULL_BLOCK * block_size  # offset 0 of the null block in the flat KV cache
        rows = -(-max_batch // ROW_ALIGN) * ROW_ALIGN
        # dtypes as StepInputs documents them; a mismatch would be a different graph (and a recompile).
        self._int64 = torch.empty(3, rows, dtype=torch.long, device=self.device)
        int32 = torch.empty(2 * rows + rows * max_blocks_per_seq, dtype=torch.int32, device=self.device)
        self._int32_rows = int32[: 2 * rows].view(2, rows)  # context_lens and state_slots, one row each
        self.input_ids, self.positions, self.slot_mapping = (self._int64[i, :max_batch] for i in range(3))
        self.context_lens, self.state_slots = (self._int32_rows[i, :max_batch] for i in range(2))
        self.block_tables = int32[2 * rows :].view(rows, max_blocks_per_seq)[:max_batch]
        for t in self.tensors():  # what the graph reads
            torch._dynamo.mark_static_address(t)
        # The padding lane's values, one column per packed group: a reset of k rows is one broadcasting copy.
        self._pad_int64 = torch.tensor([[PAD_TOKEN_ID], [PAD_POSITION], [pad_kv_row]], dtype=torch.long, device=self.device)
        self._pad_int32 = torch.tensor([[PAD_CONTEXT_LEN], [NULL_SLOT]], dtype=torch.int32, device=self.device)
        self.clear()  # sets ``_live`` and ``_width``

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The buffers in the order the compiled decode function takes them."""
        return (self.input_ids, self.positions, self.slot_mapping, self.block_tables, self.context_lens, self.state_slots)

    def check(self, step: StepInputs) -> int:
        """Validate an unpadded decode step (any batch size); returns its number of sequences N."""
        if step.is_prefill:
            raise ValueError("the decode graph runs decode steps only (got a prefill StepInputs)")
        n = step.num_sequences
        if n < 1:
            raise ValueError("a decode step needs at least one sequence")
        if step.input_ids.shape[0] != n:
            raise ValueError(f"a decode step has one token per sequence: {step.input_ids.shape[0]} tokens, {n} sequences")
        width = step.block_tables.shape[1]
        if width > self.max_blocks_per_seq:
            raise ValueError(
                f"block table of {width} blocks exceeds max_blocks_per_seq={self.max_blocks_per_seq} (max_model_len?)"
            )
        return n

    def fill(self, step: StepInputs) -> int:
        """Validate ``step`` (N sequences), copy it into rows 0..N-1 and make every other row a padding lane.

        Returns N. Three copies when the step's fields are packed as ``pack_step`` packs them (one per field
        otherwise), plus resets only where the previous step left something stale: rows N..live-1 when this step
        is smaller, and block-table columns width..old width of the rows both steps use when it is narrower (a
        block table is "null block beyond its end" by contract, StepInputs).
        """
        n = self.check(step)
        if n > self.max_batch:
            raise ValueError(f"decode batch of {n} sequences exceeds max_batch={self.max_batch}")
        width = step.block_tables.shape[1]
        # copy_ casts and moves: a step built on the CPU for a GPU runner still lands here (non_blocking: the
        # source is freshly built host memory kept alive by ``step`` until the copy is enqueued).
        _copy_rows(self._int64[:, :n], (step.input_ids, step.positions, step.slot_mapping))
        _copy_rows(self._int32_rows[:, :n], (step.context_lens, step.state_slots))
        self.block_tables[:n, :width].copy_(step.block_tables, non_blocking=True)
        if width < self._width:
            self.block_tables[: min(n, self._live), width : self._width].fill_(NULL_BLOCK)
        if n < self._live:
            self._pad(n, self._live)
        self._live, self._width = n, width
        return n

    def clear(self) -> None:
        """Make every row a padding lane (null slot, null block, context 0, token 0)."""
        self._pad(0, self.max_batch)
        self._live, self._width = 0, 0

    def _pad(self, start: int, stop: int) -> None:
        k = stop - start
        self._int64[:, start:stop].copy_(self._pad_int64.expand(-1, k))
        self._int32_rows[:, start:stop].copy_(self._pad_int32.expand(-1, k))
        self.block_tables[start:stop].fill_(NULL_BLOCK)


def _copy_rows(dst: torch.Tensor, fields: Sequence[torch.Tensor]) -> None:
    """``dst[i] = fields[i]`` for 1-D fields of ``dst.shape[1]`` elements each.

    One copy per run of consecutive fields that lie at equal distances in one buffer (as pack_step packs them:
    field after field, each start rounded up to an alignment): one copy for a packed step, two when its first field
    comes from elsewhere (the overlapped engine's input ids: the previous step's tokens), one per field for a step
    built field by field (as tensor-parallel workers receive it).
    """
    start = 0
    while start < len(fields):
        stop = start + 1
        while stop < len(fields) and _evenly_spaced(fields[start : stop + 1], dst.shape[1]):
            stop += 1
        run = fields[start:stop]
        if len(run) == 1:
            dst[start].copy_(run[0], non_blocking=True)
        else:
            gap = (run[1].data_ptr() - run[0].data_ptr()) // run[0].element_size()
            dst[start:stop].copy_(run[0].as_strided((len(run), dst.shape[1]), (gap, 1)), non_blocking=True)
        start = stop


def _evenly_spaced(fields: Sequence[torch.Tensor], n: int) -> bool:
    """Whether ``fields`` (two or more) are contiguous length-``n`` rows of one buffer, equal distances apart."""
    first = fields[0]
    size, begin = first.element_size(), first.data_ptr()
    gap = fields[1].data_ptr() - begin
    storage = first.untyped_storage().data_ptr()
    # (Inference-mode views do not record their base, so "one buffer" is checked by storage and address.)
    return gap >= n * size and gap % size == 0 and all(
        f.dtype == first.dtype and f.shape == (n,) and (n == 1 or f.stride() == (1,))
        and f.data_ptr() == begin + i * gap and f.untyped_storage().data_ptr() == storage
        for i, f in enumerate(fields)
    )
