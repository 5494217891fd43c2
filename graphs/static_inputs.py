"""Static input buffers of the compiled decode step, and the padding lanes.

A CUDA graph replays with the device addresses it was recorded with, so every tensor a decode graph reads must
live at one address for the runtime's whole life. These buffers are allocated once, sized for the largest bucket,
and marked ``torch._dynamo.mark_static_address``: reduce-overhead then reads them in place instead of copying
every non-static input into its own graph-owned buffer at each replay. Each step writes its (unpadded) StepInputs
into the first N rows; every other row is a padding lane.

A padding lane touches only the reserved rows (ops/library.py): state slot ``NULL_SLOT``, block table all
``NULL_BLOCK``, KV ``slot_mapping`` row 0 (offset 0 of the null block), ``context_len`` 0 (paged attention returns
zeros for it) and a valid token id (0, or a token an earlier step left there). The ops never read a padding lane's
result back into a live sequence.

Few copies per step: at batch 1 every copy between two graphs costs the GPU a few µs, and more in the gaps around
it (bench/NOTES.md, "Decode epilogue"). The fields are parts of one device allocation, laid out field after field:

    int64 [4, R]:       input_ids | positions | slot_mapping | ring_slot (one element, then unused)
    int32 [2 R + R W]:  context_lens | state_slots | block_tables [R, W]

R is ``max_batch`` rounded up to a multiple of 16, so every view starts 16-byte aligned (Inductor's GPU code
assumes aligned inputs and would copy a misaligned one at every call); W is ``max_blocks_per_seq``. The graph only
reads these fields, then its epilogue (``ce::advance_decode_inputs``) turns them into the next step's inputs: its
greedy tokens into ``input_ids``, and for every live row one position further (positions, context length, KV slot),
the ring slot one on. The fields share one allocation, for the one-copy staging below, but each is handed
to the graph as a tensor with a storage of its own over its part of the memory (``_own_storage``): to the compiler
they are separate buffers, as the compile rules of docs/ARCHITECTURE.md ("Compile and capture") want for buffers a
graph mutates, and they never overlap.

The tokens reach the host through ``token_ring`` [K, R], host memory the graph writes directly (on a GPU, pinned
memory seen through a device pointer): a replay writes row ``ring_slot % K``. The host reads a row after the replay
is done (``HostTokens``) and before K more replays: no device -> host copy between two graphs.

A step built on the host (``Runtime.decode`` builds them so for the runner: ``DecodeGraphRunner.step_device``) is
not copied at all when it is what the last replay left in the buffers (the steady state: the same sequences one
position further, their greedy tokens as input ids, no new KV block). Otherwise it is written into a host staging
buffer with the same layout and lands in **one** host -> device copy of the byte range it changed: from positions
(from input_ids when they come from the host) to state_slots, and through the block tables only when they changed.
Two staging buffers take turns, so the host never writes one that a queued copy may still be reading. Input ids that
are already in place (the graph's greedy tokens: the runner passes this buffer's own rows) are not copied. A step
whose fields are on the device (tensor-parallel workers receive them so) is copied field group by field group.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ops.step import SamplingInputs, StepInputs
from ops.library import NULL_BLOCK, NULL_SLOT

PAD_TOKEN_ID = 0
PAD_POSITION = 0
PAD_CONTEXT_LEN = 0
ROW_ALIGN = 16  # rows per field are a multiple of this: 64-byte (int32) and 128-byte (int64) aligned views
STAGING_BUFFERS = 2  # host staging buffers taking turns (see the module docstring)
TOKEN_RING_SLOTS = 4  # rows of the token ring: a row is read back before this many more replays
INT64_ROWS = 4  # input_ids, positions, slot_mapping, ring_slot


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
                "need max_batch, max_blocks_per_seq, block_size >= 1, "
                f"got {max_batch}, {max_blocks_per_seq}, {block_size}"
            )
        self.max_batch = max_batch
        self.max_blocks_per_seq = max_blocks_per_seq
        self.device = torch.device(device)
        self.block_size = block_size
        self._pad_kv_row = NULL_BLOCK * block_size  # offset 0 of the null block in the flat KV cache
        rows = self._rows = -(-max_batch // ROW_ALIGN) * ROW_ALIGN
        self._int32_start = INT64_ROWS * rows * 8  # bytes: where the int32 part starts
        self._tables_start = self._int32_start + 2 * rows * 4
        self._row_bytes = max_blocks_per_seq * 4  # one block-table row
        nbytes = self._tables_start + rows * self._row_bytes
        # dtypes as StepInputs documents them; a mismatch would be a different graph (and a recompile).
        self._bytes = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        self._int64, self._int32_rows, self._tables = self._views(self._bytes)  # what the copies write through
        # What the graph reads and writes: the same memory, each field as a storage of its own (see the module
        # docstring: the compiler must not see graph inputs that it mutates share a storage).
        self.input_ids, self.positions, self.slot_mapping = (_own_storage(self._int64[i, :max_batch]) for i in range(3))
        self.ring_slot = _own_storage(self._int64[3, :1])
        self.context_lens, self.state_slots = (_own_storage(self._int32_rows[i, :max_batch]) for i in range(2))
        self.block_tables = _own_storage(self._tables[:max_batch])
        self.token_ring_host, self.token_ring = host_visible((TOKEN_RING_SLOTS, rows), self.device)
        for t in self.tensors():  # what the graph reads
            torch._dynamo.mark_static_address(t)
        # The padding lane's values, one column per packed group: a reset of k rows is one broadcasting copy.
        self._pad_int64 = torch.tensor([[PAD_TOKEN_ID], [PAD_POSITION], [self._pad_kv_row]], dtype=torch.long,
                                       device=self.device)
        self._pad_int32 = torch.tensor([[PAD_CONTEXT_LEN], [NULL_SLOT]], dtype=torch.int32, device=self.device)
        # Host steps: staging buffers laid out as ``_bytes`` (pinned: asynchronous copies), as numpy views.
        pinned = self.device.type == "cuda"
        self._stages = [torch.zeros(nbytes, dtype=torch.uint8, pin_memory=pinned) for _ in range(STAGING_BUFFERS)]
        self._stage_views = [tuple(v.numpy() for v in self._views(stage)) for stage in self._stages]
        self._stage_copied: list[torch.cuda.Event | None] = [None] * STAGING_BUFFERS  # each one's last copy
        self._turn = 0
        self._next_ring_slot = 0  # the ring slot the device holds (written with every copied step)
        self.clear()  # sets ``_live``, ``_width``, ``_host_tables`` and ``_left``

    def _views(self, buffer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(int64 [4, R], int32 [2, R], block tables [R, W]) views of a byte buffer laid out as ``_bytes``."""
        rows = self._rows
        int64 = buffer[: self._int32_start].view(torch.int64).view(INT64_ROWS, rows)
        int32 = buffer[self._int32_start :].view(torch.int32)
        return int64, int32[: 2 * rows].view(2, rows), int32[2 * rows :].view(rows, self.max_blocks_per_seq)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The buffers in the order the compiled decode function takes them."""
        return (
            self.input_ids, self.positions, self.slot_mapping, self.block_tables, self.context_lens, self.state_slots,
            self.token_ring, self.ring_slot,
        )

    def check(self, step: StepInputs) -> int:
        """Validate an unpadded decode step (any batch size); returns its number of sequences N."""
        if step.is_prefill:
            raise ValueError("the decode graph runs decode steps only (got a prefill StepInputs)")
        n = step.num_sequences
        if n < 1:
            raise ValueError("a decode step needs at least one sequence")
        if step.input_ids.shape[0] != n:
            raise ValueError(
                f"a decode step has one token per sequence: {step.input_ids.shape[0]} tokens, {n} sequences"
            )
        width = step.block_tables.shape[1]
        if width > self.max_blocks_per_seq:
            raise ValueError(
                f"block table of {width} blocks exceeds max_blocks_per_seq={self.max_blocks_per_seq} (max_model_len?)"
            )
        return n

    def fill(self, step: StepInputs) -> int:
        """Validate ``step`` (N sequences), write it into rows 0..N-1 and make every other row a padding lane.

        Returns N. A step built on the host lands in one copy (``_stage``); a step on the device in one copy per
        field group (``_copy_fields``). Input ids that are this buffer's own rows 0..N-1 (``input_ids[:N]``: the
        last replay's greedy tokens, left there by the graph) are not copied.
        """
        n = self.check(step)
        if n > self.max_batch:
            raise ValueError(f"decode batch of {n} sequences exceeds max_batch={self.max_batch}")
        ids_in_place = step.input_ids.data_ptr() == self.input_ids.data_ptr() and step.input_ids.stride() == (1,)
        if step.positions.device.type == "cpu":
            self._stage(step, n, ids_in_place)
        else:
            self._copy_fields(step, n, ids_in_place)
            self._left = None
        self._live, self._width = n, step.block_tables.shape[1]
        return n

    def replays_left(self) -> int | None:
        """How many replays the live rows can run on the buffers as they are before a row's context passes the end of
        its block table (the attention would read past the table), or None where the host does not know the rows
        (after a step copied from the device)."""
        if self._left is None or self._live == 0:
            return None
        return self.max_blocks_per_seq * self.block_size - int(self._left[2].max()) + 1

    def replayed(self) -> torch.Tensor:
        """Note that a graph ran on the buffers as they are (and advanced them: ``ce::advance_decode_inputs``);
        returns the token-ring row (host memory) its greedy tokens go to."""
        row = self.token_ring_host[self._next_ring_slot % TOKEN_RING_SLOTS]
        self._next_ring_slot += 1
        if self._left is not None:
            self._left = self._advanced(*self._left)
        return row

    def forget(self) -> None:
        """The buffers were run on without ``replayed`` (warm-up, a new recording): the next step is copied whole."""
        self._left = None
        self._host_tables = None

    def clear(self) -> None:
        """Make every row a padding lane (null slot, null block, context 0, token 0)."""
        self._pad(0, self.max_batch)
        self._int64[3, 0] = self._next_ring_slot  # a device step carries no ring slot: keep the device's right
        self._live, self._width = 0, 0
        self._host_tables: np.ndarray | None = None  # what the device's block-table rows hold, where known
        # What the last replay left in rows 0..live-1 (positions, slot_mapping, context_lens, state_slots), where
        # known: a host step equal to it (input ids in place, tables unchanged) needs no copy.
        self._left: tuple[np.ndarray, ...] | None = None

    def _advanced(self, positions, slot_mapping, context_lens, state_slots) -> tuple[np.ndarray, ...] | None:
        """What ``ce::advance_decode_inputs`` makes of live rows (the same rule, on the host's copy of the tables)."""
        if self._host_tables is None:
            return None
        position = positions + 1
        block_index = position // self.block_size
        inside = block_index < self.max_blocks_per_seq
        blocks = self._host_tables[np.arange(len(position)), np.minimum(block_index, self.max_blocks_per_seq - 1)]
        blocks = np.where(inside, blocks, NULL_BLOCK).astype(np.int64)
        return position, blocks * self.block_size + position % self.block_size, context_lens + 1, state_slots

    # ----------------------------------------------------------------------------------------- host steps
    def _stage(self, step: StepInputs, n: int, ids_in_place: bool) -> None:
        """Copy nothing when the host step is what the last replay left; otherwise write it into the next staging
        buffer and copy the byte range it changed in one copy."""
        fields = (
            step.positions.numpy(), step.slot_mapping.numpy(), step.context_lens.numpy(), step.state_slots.numpy()
        )
        table_rows = self._update_host_tables(step.block_tables.numpy(), n)
        left = self._left
        self._left = fields
        if ids_in_place and not table_rows and left is not None and all(map(np.array_equal, left, fields)):
            return
        k, self._turn = self._turn, (self._turn + 1) % STAGING_BUFFERS
        if self._stage_copied[k] is not None:
            self._stage_copied[k].synchronize()  # the copy that last read this buffer (long done, in practice)
        int64, int32_rows, tables = self._stage_views[k]
        if not ids_in_place:
            ids = step.input_ids
            if ids.device.type != "cpu":  # e.g. the previous step's sampled tokens: a device copy of their own
                self.input_ids[:n].copy_(ids, non_blocking=True)
            else:
                int64[0, :n], int64[0, n:] = ids.numpy(), PAD_TOKEN_ID
        host_ids = not ids_in_place and step.input_ids.device.type == "cpu"
        int64[1, :n], int64[1, n:] = fields[0], PAD_POSITION
        int64[2, :n], int64[2, n:] = fields[1], self._pad_kv_row
        int64[3, 0] = self._next_ring_slot
        int32_rows[0, :n], int32_rows[0, n:] = fields[2], PAD_CONTEXT_LEN
        int32_rows[1, :n], int32_rows[1, n:] = fields[3], NULL_SLOT
        start = 0 if host_ids else self._rows * 8  # from input_ids or from positions
        stop = self._tables_start
        if table_rows:
            tables[:table_rows] = self._host_tables[:table_rows]
            stop += table_rows * self._row_bytes
        stage = self._stages[k]
        self._bytes[start:stop].copy_(stage[start:stop], non_blocking=True)
        if self.device.type == "cuda":
            self._stage_copied[k] = torch.cuda.Event()
            self._stage_copied[k].record()

    def _update_host_tables(self, step_tables: np.ndarray, n: int) -> int:
        """Bring ``_host_tables`` (the device's block-table rows as the next copy leaves them) up to this step;
        returns how many leading rows the copy must carry (0: the device's tables are already right)."""
        width, live = step_tables.shape[1], self._live
        host = self._host_tables
        if host is not None and n == live and width == self._width and np.array_equal(host[:n, :width], step_tables):
            return 0
        if host is None:  # unknown (after clear() or a device step): every row the copy carries is rewritten
            host = self._host_tables = np.full((self._rows, self.max_blocks_per_seq), NULL_BLOCK, dtype=np.int32)
        host[:n, :width], host[:n, width:] = step_tables, NULL_BLOCK
        host[n:live] = NULL_BLOCK  # rows the last step used and this one does not: padding lanes again
        return max(n, live)

    # --------------------------------------------------------------------------------------- device steps
    def _copy_fields(self, step: StepInputs, n: int, ids_in_place: bool) -> None:
        """Copy a step whose fields are on the device: one copy per run of evenly spaced fields (pack_step's layout
        makes input_ids | positions | slot_mapping one run, context_lens | state_slots another), the block table a
        third, plus resets only where the previous step left stale rows or columns."""
        width = step.block_tables.shape[1]
        if ids_in_place:
            _copy_rows(self._int64[1:3, :n], (step.positions, step.slot_mapping))
        else:
            _copy_rows(self._int64[:3, :n], (step.input_ids, step.positions, step.slot_mapping))
        _copy_rows(self._int32_rows[:, :n], (step.context_lens, step.state_slots))
        self._int64[3, 0] = self._next_ring_slot
        self.block_tables[:n, :width].copy_(step.block_tables, non_blocking=True)
        if width < self._width:
            self.block_tables[: min(n, self._live), width : self._width].fill_(NULL_BLOCK)
        if n < self._live:
            self._pad(n, self._live)
        self._host_tables = None  # the device's tables changed behind the staging path's back

    def _pad(self, start: int, stop: int) -> None:
        k = stop - start
        self._int64[:3, start:stop].copy_(self._pad_int64.expand(-1, k))  # not the ring slot's row
        self._int32_rows[:, start:stop].copy_(self._pad_int32.expand(-1, k))
        self.block_tables[start:stop].fill_(NULL_BLOCK)


class StaticSamplingInputs:
    """Device buffers of a sampled decode step's per-row parameters (``ce::sample``'s: ops/sample.py), one row per
    lane, for the decode graphs that sample.

    ``fill`` writes a step's rows and makes every other row a greedy padding lane (temperature 0, every filter off),
    which the sampler passes through at no cost. Unlike the step inputs, nothing here is predicted by the graph: a
    sampled step's parameters (the counters at least) change every step, and they are a few hundred bytes, so each
    sampled step copies them, one copy per dtype (fp32: temperature | top_p | min_p; int64: top_k | seeds |
    counters), from pinned staging buffers taking turns. The graph only reads them.
    """

    def __init__(self, max_batch: int, device: torch.device):
        self.max_batch = max_batch
        self.device = torch.device(device)
        rows = -(-max_batch // ROW_ALIGN) * ROW_ALIGN
        self._f32 = torch.zeros(3, rows, dtype=torch.float32, device=self.device)
        self._i64 = torch.zeros(3, rows, dtype=torch.long, device=self.device)
        self.temperature, self.top_p, self.min_p = (_own_storage(self._f32[i, :max_batch]) for i in range(3))
        self.top_k, self.seeds, self.counters = (_own_storage(self._i64[i, :max_batch]) for i in range(3))
        for t in self.tensors():
            torch._dynamo.mark_static_address(t)
        pinned = self.device.type == "cuda"
        self._stages = [(torch.zeros(3, rows, dtype=torch.float32, pin_memory=pinned),
                         torch.zeros(3, rows, dtype=torch.long, pin_memory=pinned)) for _ in range(STAGING_BUFFERS)]
        self._stage_copied: list[torch.cuda.Event | None] = [None] * STAGING_BUFFERS
        self._turn = 0
        self._pad_values(self._f32, self._i64, 0)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The buffers in the order the compiled decode function takes them."""
        return self.temperature, self.top_k, self.top_p, self.min_p, self.seeds, self.counters

    @staticmethod
    def _pad_values(f32: torch.Tensor, i64: torch.Tensor, start: int) -> None:
        f32[0, start:], f32[1, start:], f32[2, start:] = 0.0, 1.0, 0.0  # greedy; top_p and min_p off
        i64[:, start:] = 0  # top_k off, seed and counter 0

    def fill(self, sampling: SamplingInputs, n: int) -> None:
        """Rows 0..n-1 take ``sampling``'s ``[n]`` fields (host or device tensors); every other row is padding."""
        fields = (sampling.temperature, sampling.top_p, sampling.min_p, sampling.top_k, sampling.seeds,
                  sampling.counters)
        if any(t.shape != (n,) for t in fields):
            raise ValueError(f"sampling inputs must be [{n}] each, got {[tuple(t.shape) for t in fields]}")
        if n > self.max_batch:
            raise ValueError(f"decode batch of {n} sequences exceeds max_batch={self.max_batch}")
        if sampling.temperature.device.type != "cpu":
            for dst, src in zip((*self._f32, *self._i64), fields):
                dst[:n].copy_(src, non_blocking=True)
            self._pad_values(self._f32, self._i64, n)
            return
        k, self._turn = self._turn, (self._turn + 1) % STAGING_BUFFERS
        if self._stage_copied[k] is not None:
            self._stage_copied[k].synchronize()  # the copy that last read this buffer (long done, in practice)
        f32, i64 = self._stages[k]
        for dst, src in zip((*f32, *i64), fields):
            dst[:n] = src
        self._pad_values(f32, i64, n)
        self._f32.copy_(f32, non_blocking=True)
        self._i64.copy_(i64, non_blocking=True)
        if self.device.type == "cuda":
            self._stage_copied[k] = torch.cuda.Event()
            self._stage_copied[k].record()


_TYPESTR = {torch.int64: "<i8", torch.int32: "<i4", torch.float32: "<f4"}


def _own_storage(view: torch.Tensor) -> torch.Tensor:
    """``view`` (a contiguous view of a larger buffer) as a tensor with a storage of its own, over the same memory.

    Dynamo and AOTAutograd see graph inputs that share a storage as aliases, and inputs the graph mutates that alias
    go through a "synthetic base": on torch 2.13 the views of one uint8 buffer read as int64 and int32 came out of it
    with the wrong sizes (zero elements), and the mutations were lost. These fields never overlap, so separate
    storage objects tell the compiler the truth. The wrapper does not own the memory: it keeps the buffer alive.
    """
    own = _cuda_tensor_at(view, view.device) if view.device.type == "cuda" else torch.from_numpy(view.numpy())
    own._aliased_buffer = view  # keeps the memory alive
    return own


def host_visible(shape: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(host tensor, the same memory as a tensor on ``device``) of int64 zeros: on CUDA, pinned memory, which a kernel
    reads and writes through the same address (unified virtual addressing), wrapped as a CUDA tensor through the CUDA
    array interface; on the CPU, one tensor twice. What a graph writes there is read on the host with no copy once
    the graph is done (the decode graph's token ring; a compiled speculative round's results:
    compiled_engine/speculative.py)."""
    host = torch.zeros(shape, dtype=torch.long, pin_memory=device.type == "cuda")
    if device.type != "cuda":
        return host, host
    seen = _cuda_tensor_at(host, device)
    seen._host_memory = host  # keeps the pinned memory alive as long as the device view
    return host, seen


def _cuda_tensor_at(memory: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A new CUDA tensor (a storage of its own, owning nothing) over ``memory``'s elements (contiguous), read
    through the CUDA array interface, which is how torch wraps memory it did not allocate."""

    class _Interface:
        __cuda_array_interface__ = {"shape": tuple(memory.shape), "typestr": _TYPESTR[memory.dtype],
                                    "data": (memory.data_ptr(), False), "strides": None, "version": 3}

    return torch.as_tensor(_Interface(), device=device)


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
