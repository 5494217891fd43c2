"""Static input buffers of the compiled decode step, and the padding lanes.

A CUDA graph replays with the device addresses it was recorded with, so every tensor a decode graph reads must
live at one address for the runtime's whole life. These buffers are allocated once, sized for the largest bucket,
and marked ``torch._dynamo.mark_static_address``: reduce-overhead then reads them in place instead of copying
every non-static input into its own graph-owned buffer at each replay. Each step copies the (unpadded) StepInputs
built by ``Runtime.build_step`` into the first N rows and turns rows N..bucket-1 into padding lanes.

A padding lane touches only the reserved rows (ops/library.py): state slot ``NULL_SLOT``, block table all
``NULL_BLOCK``, KV ``slot_mapping`` row 0 (offset 0 of the null block), ``context_len`` 0 (paged attention returns
zeros for it) and token id 0. The ops never read a padding lane's result back into a live sequence.
"""

from __future__ import annotations

import torch

from compiled_engine.step_inputs import StepInputs
from ops.library import NULL_BLOCK, NULL_SLOT

PAD_TOKEN_ID = 0
PAD_POSITION = 0
PAD_CONTEXT_LEN = 0


class StaticDecodeInputs:
    """Device buffers, one row per lane, for decode batches of up to ``max_batch`` sequences."""

    def __init__(self, max_batch: int, max_blocks_per_seq: int, block_size: int, device: torch.device):
        if max_batch < 1 or max_blocks_per_seq < 1 or block_size < 1:
            raise ValueError(
                f"need max_batch, max_blocks_per_seq, block_size >= 1, got {max_batch}, {max_blocks_per_seq}, {block_size}"
            )
        self.max_batch = max_batch
        self.max_blocks_per_seq = max_blocks_per_seq
        self.device = torch.device(device)
        self.pad_kv_row = NULL_BLOCK * block_size  # offset 0 of the null block in the flat KV cache

        def buffer(*shape: int, dtype: torch.dtype, fill: int) -> torch.Tensor:
            t = torch.full(shape, fill, dtype=dtype, device=self.device)
            torch._dynamo.mark_static_address(t)
            return t

        # dtypes as StepInputs documents them; a mismatch would be a different graph (and a recompile).
        self.input_ids = buffer(max_batch, dtype=torch.long, fill=PAD_TOKEN_ID)
        self.positions = buffer(max_batch, dtype=torch.long, fill=PAD_POSITION)
        self.slot_mapping = buffer(max_batch, dtype=torch.long, fill=self.pad_kv_row)
        self.block_tables = buffer(max_batch, max_blocks_per_seq, dtype=torch.int32, fill=NULL_BLOCK)
        self.context_lens = buffer(max_batch, dtype=torch.int32, fill=PAD_CONTEXT_LEN)
        self.state_slots = buffer(max_batch, dtype=torch.int32, fill=NULL_SLOT)

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

    def fill(self, step: StepInputs, bucket: int) -> None:
        """Copy ``step`` (N sequences) into rows 0..N-1 and make rows N..bucket-1 padding lanes.

        Rows at or beyond ``bucket`` are not read by that bucket's graph, so they are left as they are. Columns of
        the block table beyond the step's width are reset to the null block: the previous step may have left a
        longer table there, and a block table is "null block beyond its end" by contract (StepInputs).
        """
        n = self.check(step)
        if not n <= bucket <= self.max_batch:
            raise ValueError(f"decode batch of {n} sequences does not fit bucket {bucket} (max {self.max_batch})")
        width = step.block_tables.shape[1]
        # copy_ casts and moves: a step built on the CPU for a GPU runner still lands here (non_blocking: the
        # source is freshly built host memory kept alive by ``step`` until the copy is enqueued).
        self.input_ids[:n].copy_(step.input_ids, non_blocking=True)
        self.positions[:n].copy_(step.positions, non_blocking=True)
        self.slot_mapping[:n].copy_(step.slot_mapping, non_blocking=True)
        self.block_tables[:n, :width].copy_(step.block_tables, non_blocking=True)
        if width < self.max_blocks_per_seq:
            self.block_tables[:n, width:].fill_(NULL_BLOCK)
        self.context_lens[:n].copy_(step.context_lens, non_blocking=True)
        self.state_slots[:n].copy_(step.state_slots, non_blocking=True)
        if n < bucket:
            self.pad(n, bucket)

    def pad(self, start: int, stop: int) -> None:
        """Make rows start..stop-1 padding lanes (null slot, null block, context 0, token 0)."""
        self.input_ids[start:stop].fill_(PAD_TOKEN_ID)
        self.positions[start:stop].fill_(PAD_POSITION)
        self.slot_mapping[start:stop].fill_(self.pad_kv_row)
        self.block_tables[start:stop].fill_(NULL_BLOCK)
        self.context_lens[start:stop].fill_(PAD_CONTEXT_LEN)
        self.state_slots[start:stop].fill_(NULL_SLOT)
