"""BlockTables: the block tables of the sequences holding state slots, kept by slot for packing a step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence as Seq

import numpy as np

from ops.library import NULL_BLOCK

if TYPE_CHECKING:
    from compiled_engine.sequence import Sequence


class BlockTables:
    """The block tables of the sequences holding state slots, as one host array ``[num_slots, width]`` int32 indexed
    by slot (NULL_BLOCK past each table's end), so that packing a step takes its rows with one numpy gather instead of
    converting every sequence's ``block_table`` list (at 512 sequences of 8,192 tokens that conversion was most of
    a decode step's host time: bench/NOTES.md, "Runs 112-116").

    The lists stay the truth; a row follows its list lazily, at ``rows``. While a sequence holds its slot its list
    only grows (blocks are appended; a released sequence gets a new, empty list), so a row is brought up to date by
    copying what was appended since its last sync: one length test a sequence a step, and a block's worth of work
    once every block_size decode steps. A row whose list is another object (the slot changed hands, or the list was
    replaced) or shorter than what was copied is rewritten whole."""

    def __init__(self, num_slots: int, width: int = 64):
        self.array = np.full((num_slots, width), NULL_BLOCK, dtype=np.int32)
        self._lists: list[list[int] | None] = [None] * num_slots  # the list each row follows (held: ids stay unique)
        self._synced = [0] * num_slots  # how many of its entries the row has

    def rows(self, seqs: Seq[Sequence], width: int) -> np.ndarray:
        """``[len(seqs), width]`` int32: each sequence's table (by its ``state_slot``), NULL_BLOCK past its end."""
        lists, synced = self._lists, self._synced
        self._fit(width)
        for seq in seqs:
            slot, table = seq.state_slot, seq.block_table
            n = len(table)
            if lists[slot] is table and synced[slot] == n:
                continue
            self._fit(n)
            row = self.array[slot]
            if lists[slot] is not table or synced[slot] > n:
                row[:] = NULL_BLOCK
                lists[slot], synced[slot] = table, 0
            row[synced[slot] : n] = table[synced[slot] :]
            synced[slot] = n
        return self.array[[seq.state_slot for seq in seqs], :width]

    def _fit(self, width: int) -> None:
        """Widen the array to at least ``width`` columns (doubling: a long sequence widens it a few times at most)."""
        columns = self.array.shape[1]
        if width > columns:
            grown = np.full((self.array.shape[0], max(width, 2 * columns)), NULL_BLOCK, dtype=np.int32)
            grown[:, :columns] = self.array
            self.array = grown
