"""When speculative decoding drafts: ``DraftingRule``, behind ``speculative_config``'s ``auto_disable``.

A verify round costs more than a plain decode step (k + 1 rows a sequence, the MTP layer, the acceptance), so
drafting pays only where what a round delivers outweighs that: 1 + a tokens a round against one a step, a being the
mean number of drafts a verified row accepts. The rule measures both sides as the engine runs: the wall time of its
verify rounds and of its plain decode steps, by the number of rows in the step (a round reads its tokens back, so
its wall time is its cost; a plain step overlapped with the next, ``overlap_decode``, is timed from its launch to the
previous step's read-back, in steady state what a plain engine's step costs), and the drafts each verified row
accepts. At d rows it drafts
while ``(1 + a) * plain(d) > round(d)``. With drafting off it still drafts one round after every ``probe_interval``
plain steps, so that acceptance that rises again (new requests, other text) turns drafting back on.

The first measurement of each kind at each row count is dropped (it may carry one-time work such as a graph
capture); later ones are smoothed (an exponential moving average). Where a cost is not known yet the rule measures
it: drafting first, then a plain step. Decisions follow wall-clock time, so which steps draft can differ between
runs; the tokens cannot: a verified row emits what plain decoding emits (greedy, or a seeded request's draw).
"""

from __future__ import annotations

import time
from typing import Callable


class DraftingRule:
    """Whether the engine's next step drafts for its d decode-ready rows (``should_draft``), from the engine's
    measurements (``record_round``, ``record_plain``). ``clock``: the time source the engine reads (seconds)."""

    def __init__(self, probe_interval: int = 64, smoothing: float = 0.25,
                 clock: Callable[[], float] = time.perf_counter):
        if probe_interval < 1 or not 0.0 < smoothing <= 1.0:
            raise ValueError(f"DraftingRule needs probe_interval >= 1 and 0 < smoothing <= 1, got {probe_interval}, "
                             f"{smoothing}")
        self.probe_interval = probe_interval
        self.smoothing = smoothing
        self.clock = clock
        self.round_s: dict[int, float] = {}  # rows -> smoothed wall seconds of a verify round
        self.plain_s: dict[int, float] = {}  # rows -> smoothed wall seconds of a plain decode step
        self.accepted: float | None = None  # smoothed drafts accepted per verified row
        self._seen: set[tuple[str, int]] = set()  # (kind, rows) measured once: the dropped first measurement
        self._plain_since_round = 0
        self._probing = False

    def should_draft(self, rows: int) -> bool:
        if self._probing:
            return True
        round_s, plain_s = self.round_s.get(rows), self.plain_s.get(rows)
        if round_s is None or self.accepted is None:
            return True
        if plain_s is None:
            return False
        if (1.0 + self.accepted) * plain_s > round_s:
            return True
        if self._plain_since_round >= self.probe_interval:
            self._probing = True  # until a round with drafts is recorded (the first verifies placeholders)
            return True
        return False

    def record_round(self, rows: int, seconds: float, drafted_rows: int, accepted_drafts: int) -> None:
        """A verify round of ``rows`` rows in ``seconds``, of which ``drafted_rows`` verified drafts (the others, rows
        back from plain steps, placeholders) and accepted ``accepted_drafts`` of them in all. Only a round with drafts
        measures acceptance, and ends a probe."""
        self._record(self.round_s, "round", rows, seconds)
        if drafted_rows:
            self._probing = False
            self._plain_since_round = 0
            per_row = accepted_drafts / drafted_rows
            self.accepted = per_row if self.accepted is None else self._smooth(self.accepted, per_row)

    def record_plain(self, rows: int, seconds: float) -> None:
        """A plain decode step of ``rows`` rows, in ``seconds``."""
        self._plain_since_round += 1
        self._record(self.plain_s, "plain", rows, seconds)

    def _record(self, table: dict[int, float], kind: str, rows: int, seconds: float) -> None:
        if (kind, rows) not in self._seen:
            self._seen.add((kind, rows))
            return
        table[rows] = seconds if rows not in table else self._smooth(table[rows], seconds)

    def _smooth(self, old: float, new: float) -> float:
        return old + self.smoothing * (new - old)
