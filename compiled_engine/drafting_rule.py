"""When speculative decoding drafts: ``DraftingRule``, behind ``speculative_config``'s ``auto_disable``.

A verify round costs more than a plain decode step (k + 1 rows a sequence, the MTP layer, the acceptance), so
drafting pays only where what a round delivers outweighs that: 1 + a tokens a round against one a step, a being the
mean number of drafts a verified row accepts. The rule measures both sides as the engine runs: the wall time of its
verify rounds and of its plain decode steps, by the number of rows in the step (a round from its launch to its
read-back: in steady state what a round costs, chained or not; a plain step overlapped with the next,
``overlap_decode``, from its launch to the previous step's read-back, in steady state what a plain engine's step
costs), and the drafts each verified row accepts. At d rows it drafts while ``(1 + a) * plain(d) > round(d)``.
With drafting off it still drafts one round after every ``probe_interval`` plain steps, so that acceptance that
rises again (new requests, other text) turns drafting back on.

The first measurement of each kind at each row count is dropped (it may carry one-time work such as a graph
capture); later ones are smoothed (an exponential moving average, ``smoothing``). Where a cost is not known yet the
rule measures it: drafting first, then a plain step.

The acceptance a is an estimate from a noisy sample: one row accepts anywhere from 0 to k drafts, so with one row a
round a mean over a few rounds often falls on the wrong side of a break-even near the true mean. Errors cost unevenly:
a round that does not pay loses a fraction of a step, a stop that should not have happened loses up to
``probe_interval`` steps' gain. Hence:

- a is a mean over rows, not rounds: the drafts accepted over the rows that verified drafts, each row weighted by
  ``(1 - 1 / memory_rows) ** n``, n the rows decoded since (a ratio of two decayed sums). It remembers about
  ``memory_rows`` rows, as many at one row a round as at eight.
- Every decoded row ages those sums, plain ones too: they carry no acceptance, but the text moves on, and after a
  stretch of plain steps a probe's rows must weigh against what is left of the old evidence, not be drowned by it.
- Drafting, once on (from the start, or when a probe's rows say it pays), runs at least ``memory_rows / 4`` drafted
  rows before a may stop it: a stop on fewer is mostly noise. A probe whose rows say drafting does not pay ends at
  once, so where it clearly does not pay the probes stay one round with drafts each. With ``num_drafts`` (k) known,
  that floor also yields to an optimistic estimate: a per-draft acceptance p from the rows seen (each counted as
  accepting as many of its drafts as their sum allows) plus ``OPTIMISM_DRAFTS`` more accepted drafts, read as
  p + p^2 + ... + p^k drafts a row. Where even that does not pay (acceptance near 0) drafting stops at once, instead
  of paying ``memory_rows / 4`` rounds that cannot pay at every start. The prior counts drafts, not rows of k drafts,
  so it does not grow with k: a larger k, whose rounds cost more, stops no later than a smaller one.

Decisions follow wall-clock time, so which steps draft can differ between runs; the tokens cannot: a verified row
emits what plain decoding emits (greedy, or a seeded request's draw).
"""

from __future__ import annotations

import time
from typing import Callable


class DraftingRule:
    """Whether the engine's next step drafts for its d decode-ready rows (``should_draft``), from the engine's
    measurements (``record_round``, ``record_plain``). ``clock``: the time source the engine reads (seconds).
    ``memory_rows``: how many recent rows the acceptance estimate remembers (1: the last round's alone).
    ``num_drafts``: the drafts a row verifies (k; None: unknown, no optimistic stop)."""

    OPTIMISM_DRAFTS = 4  # accepted drafts added to the evidence for the optimistic estimate

    def __init__(self, probe_interval: int = 64, smoothing: float = 0.25,
                 clock: Callable[[], float] = time.perf_counter, memory_rows: int = 64,
                 num_drafts: int | None = None):
        if probe_interval < 1 or not 0.0 < smoothing <= 1.0 or memory_rows < 1:
            raise ValueError(f"DraftingRule needs probe_interval >= 1, 0 < smoothing <= 1 and memory_rows >= 1, got "
                             f"{probe_interval}, {smoothing}, {memory_rows}")
        self.probe_interval = probe_interval
        self.num_drafts = num_drafts
        self.smoothing = smoothing
        self.clock = clock
        self.round_s: dict[int, float] = {}  # rows -> smoothed wall seconds of a verify round
        self.plain_s: dict[int, float] = {}  # rows -> smoothed wall seconds of a plain decode step
        self.accepted: float | None = None  # drafts accepted per verified row: _accepted_sum / _drafted_sum
        self._keep = 1.0 - 1.0 / memory_rows  # the weight a row's measurement keeps per row decoded after it
        self._accepted_sum = 0.0  # decayed drafts accepted
        self._drafted_sum = 0.0  # decayed rows that verified drafts
        self._min_run = memory_rows // 4  # drafted rows a run of drafting lasts at the least
        self._on = True  # drafting is on: it starts on
        self._run = 0  # rows that verified drafts since drafting last stopped
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
            self._on = True
            return True
        if self._on and self._run < self._min_run and not self._hopeless(plain_s, round_s):
            return True  # too few rows to stop on
        self._on, self._run = False, 0
        if self._plain_since_round >= self.probe_interval:
            self._probing = True  # until a round with drafts is recorded (the first verifies placeholders)
            return True
        return False

    def _hopeless(self, plain_s: float, round_s: float) -> bool:
        """Whether drafting would not pay even at an optimistic per-draft acceptance: the rows seen, each counted as
        accepting as many of its drafts as their sum allows, plus ``OPTIMISM_DRAFTS`` more accepted drafts."""
        k = self.num_drafts
        if k is None:
            return False
        accepted = self._accepted_sum + self.OPTIMISM_DRAFTS
        rejected = max(0.0, self._drafted_sum - self._accepted_sum / k)  # rows that stopped short of k: the fewest
        p = accepted / (accepted + rejected)
        optimistic = sum(p ** i for i in range(1, k + 1))  # drafts a row accepts when each is accepted with p
        return (1.0 + optimistic) * plain_s <= round_s

    def record_round(self, rows: int, seconds: float, drafted_rows: int, accepted_drafts: int) -> None:
        """A verify round of ``rows`` rows in ``seconds``, of which ``drafted_rows`` verified drafts (the others, rows
        back from plain steps, placeholders) and accepted ``accepted_drafts`` of them in all. Only a round with drafts
        measures acceptance, and ends a probe."""
        self._record(self.round_s, "round", rows, seconds)
        self._age(rows)
        if drafted_rows:
            self._probing = False
            self._plain_since_round = 0
            self._run += drafted_rows
            self._accepted_sum += accepted_drafts
            self._drafted_sum += drafted_rows
            self.accepted = self._accepted_sum / self._drafted_sum

    def record_plain(self, rows: int, seconds: float) -> None:
        """A plain decode step of ``rows`` rows, in ``seconds``."""
        self._plain_since_round += 1
        self._record(self.plain_s, "plain", rows, seconds)
        self._age(rows)

    def _age(self, rows: int) -> None:
        """``rows`` rows decoded: the acceptance sums decay alike, so their ratio, ``accepted``, stays."""
        decay = self._keep ** rows
        self._accepted_sum *= decay
        self._drafted_sum *= decay

    def _record(self, table: dict[int, float], kind: str, rows: int, seconds: float) -> None:
        if (kind, rows) not in self._seen:
            self._seen.add((kind, rows))
            return
        table[rows] = seconds if rows not in table else self._smooth(table[rows], seconds)

    def _smooth(self, old: float, new: float) -> float:
        return old + self.smoothing * (new - old)
