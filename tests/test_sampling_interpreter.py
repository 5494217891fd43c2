"""``ce::sample``'s Triton kernels (ops/triton/sample_kernels.py) on the CPU, by Triton's interpreter: token for
token equal to the op's reference (ops/sample.py), which tests/test_sampling_op.py checks against a float64 oracle.

Cases: hypothesis-generated batches (tests/test_sampling_op.py's ``sampling_cases``: ties, many ties on a coarse
grid, -inf / NaN / +inf logits, rows of -inf, bf16 / fp16 / fp32, greedy and sampled rows, top_k 0 / 1 / > V,
top_p 1, min_p 0, the use_top_k / use_top_p switches) with V from 1 to 3,000, small tiles so that rows span several
chunks and blocks (V rarely a multiple of either), strided rows; hand-picked cases for every decision (ties at the
k-th largest across chunks, the exact top-p and min-p boundaries, rows without a finite maximum, one-token rows,
tiny and subnormal temperatures); and batch invariance of the kernel itself (each row alone, and the rows permuted).
Every case runs through both paths: the row path (one program decides a sampled top-k row from its few candidates),
with the radix passes for the rows it leaves, and the radix passes alone (``row_candidates=0``); which rows the row
path takes is checked on its own.

``TRITON_INTERPRET=1`` must be set before triton decorates the kernels, so each group of checks runs in a child
process (the parent never imports triton), which prints one JSON line {check: error message or null}.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from tests import background

REPO = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------------------------
# Child process
# ----------------------------------------------------------------------------------------------------------------


def _child_checks(group: str) -> dict:
    import math

    import torch
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    from ops.sample import log_ce, sample_reference
    from ops.triton import sample_kernels
    from tests.test_sampling_op import NOISE_TIE, exact_quarter_logit, sampling_cases

    def tiling(vocab, chunk, block):
        """At most ~24 chunks of at most ~16 blocks (the interpreter runs every program in turn)."""
        chunk = max(chunk, triton_next_pow2(-(-vocab // 24)))
        return chunk, min(chunk, max(block, chunk // 16))

    def triton_next_pow2(n):
        return 1 << max(0, (n - 1).bit_length())

    def check(case, chunk, block, strided=False, row_candidates=(0, sample_kernels.ROW_CANDIDATES)):
        logits, *params = case
        if strided:  # rows of a wider tensor
            wide = torch.full((logits.shape[0], logits.shape[1] + 5), 7.0, dtype=logits.dtype)
            wide[:, 2 : 2 + logits.shape[1]] = logits
            logits = wide[:, 2 : 2 + logits.shape[1]]
        chunk, block = tiling(logits.shape[1], chunk, block)
        want = sample_reference(logits, *params)
        for capacity in row_candidates:
            got = sample_kernels.sample(logits, *params, chunk=chunk, block=block, row_candidates=capacity)
            assert got.dtype == torch.int64 and torch.equal(got, want), (
                f"kernel {got.tolist()} != reference {want.tolist()} (V {logits.shape[1]}, {logits.dtype}, chunk "
                f"{chunk}, block {block}, row candidates {capacity}, "
                f"params {[p.tolist() if torch.is_tensor(p) else p for p in params]})")
        return got

    def hypothesis_check(vocab_sizes, examples):
        @settings(max_examples=examples, derandomize=True, deadline=None, database=None,
                  phases=(Phase.explicit, Phase.generate), suppress_health_check=list(HealthCheck))
        @given(sampling_cases(vocab_sizes=vocab_sizes, max_rows=4), st.sampled_from([16, 64, 256]),
               st.sampled_from([16, 32]), st.booleans(), st.sampled_from([0, 16, sample_kernels.ROW_CANDIDATES]))
        def run(case, chunk, block, strided, row_candidates):
            check(case, chunk, block, strided, row_candidates=(row_candidates,))

        run()

    def rows(logits, t, k, top_p, min_p, flags=(True, True), seed0=11):
        n = logits.shape[0]
        full = lambda value, dtype: torch.full((n,), value, dtype=dtype) if not isinstance(value, list) else (  # noqa
            torch.tensor(value, dtype=dtype))
        return (logits, full(t, torch.float32), full(k, torch.int64), full(top_p, torch.float32),
                full(min_p, torch.float32), torch.arange(n, dtype=torch.int64) * 7919 + seed0,
                torch.arange(n, dtype=torch.int64), *flags)

    def ties_data():
        """The logits of the groups below, drawn in this order from one generator (as when they were one group)."""
        gen = torch.Generator().manual_seed(3)
        grid = (torch.randn(4, 300, generator=gen) * 1.5).round().to(torch.bfloat16)
        wide = (torch.randn(3, 2000, generator=gen) * 2.5).round(decimals=1)
        flat = torch.randn(16, 100, generator=gen)
        filler = -50.0 - 40.0 * torch.rand(5120 - 6, generator=gen)
        return grid, wide, flat, filler

    def ties_and_small_k():
        grid, _, flat, _ = ties_data()
        # Ties at the k-th largest spread over chunks and blocks: 300 logits on a grid of ~9 values.
        for k, top_p in ((1, 1.0), (17, 0.6), (299, 1.0)):
            check(rows(grid, [1.0, 0.7, 2.0, 0.0], k, top_p, 0.0), 64, 16)
        # Small k at a high temperature: every drawn token is among the row's k largest (torch.topk; no ties in
        # fp32 normals), and the tokens are not all the argmax.
        for k in (1, 2, 3):
            got = check(rows(flat, 5.0, k, 1.0, 0.0), 64, 16)
            assert (flat.topk(k, dim=-1).indices == got[:, None]).any(-1).all(), (k, got)
            assert k == 1 or not torch.equal(got, flat.argmax(dim=-1)), (k, got)

    def block_skipping(dtype_and_k):
        _, wide, _, _ = ties_data()
        # Block skipping (the bound is the k-th largest block maximum): 125 blocks a row, k from 1 to past the block
        # count, ties on a grid, in bf16 (16 key bits) and fp32 (32), with top-p and min-p after top-k.
        wide[2, 1500:] = wide[2, 3]  # one tied value spread over many blocks
        for dtype, k in dtype_and_k:
            check(rows(wide.to(dtype), [1.0, 0.6, 1.5], k, [1.0, 0.8, 0.95], [0.0, 0.05, 0.0]), 256, 16)

    def boundaries():
        *_, filler = ties_data()
        # The exact top-p boundary (masses 1 and 4 x 1/4, top_p 0.5: the four are dropped) and min-p's.
        q = exact_quarter_logit()
        # With top-k on too (5 keeps the five largest), which the row path decides.
        row = torch.tensor([[0.0, q, -30.0, q, q, q] + [-50.0] * 40])
        for k in (0, 5):
            got = check(rows(row.expand(6, -1).clone(), 1.0, k, 0.5, 0.0), 16, 16)
            assert set(got.tolist()) == {0}, got
            check(rows(row.expand(6, -1).clone(), 1.0, k, 0.51, 0.0), 16, 16)
        # The same boundary through the row path's implicit k (top-p alone; 320 blocks of 16, so the 256th largest
        # block maximum leaves ~500 candidates): the filler's masses are 0, so S = 2**33 exactly. Every row is taken
        # by the row path (radix=False: no radix pass runs) and draws the reference's token.
        row = torch.cat([torch.tensor([0.0, q, -30.0, q, q, q]), filler])[None].expand(8, -1).clone()
        for top_p, allowed in ((0.5, {0}), (0.51, {0, 1, 3, 4, 5})):
            args = rows(row, 1.0, 0, top_p, 0.0)[:7]
            got = sample_kernels.sample(*args, chunk=512, block=16, radix=False)
            assert torch.equal(got, sample_reference(*args)) and set(got.tolist()) <= allowed, (top_p, got)
        assert len(set(got.tolist())) > 1, got  # at 0.51 the four tokens of mass 1/4 are kept
        y = log_ce(torch.tensor([0.3])).item()
        below = torch.nextafter(torch.tensor(y), torch.tensor(-math.inf)).item()
        for k in (0, 3):
            got = check(rows(torch.tensor([[below, 0.0, y, -0.1]]).expand(32, -1).clone(), 1.0, k, 1.0, 0.3), 16, 16)
            assert set(got.tolist()) == {1, 2, 3}, got
        # Exactly tied Gumbel scores (equal logits, equal noise at tokens 13 and 24): the first index wins, across
        # chunks (16), across blocks of a chunk (32 / 16), and inside a block (64).
        seed, counter, vocab, (first, _) = NOISE_TIE
        tie = rows(torch.zeros(1, vocab), 1.0, 0, 1.0, 0.0)
        tie = (*tie[:5], torch.tensor([seed]), torch.tensor([counter]), *tie[7:])
        for chunk, block in ((16, 16), (32, 16), (64, 64)):
            assert check(tie, chunk, block).item() == first

    def special_rows():
        gen = torch.Generator().manual_seed(5)
        # Rows without a finite maximum, NaN and +inf, all tied, the maximum in the last partial chunk; k > V;
        # greedy beside sampled.
        special = torch.randn(5, 70, generator=gen)
        special[0] = -math.inf
        special[1, [3, 40]] = math.inf
        special[2, [0, 5, 69]] = math.nan
        special[3, :] = special[3, 9]
        special[4, 64:] = 9.0
        for dtype in (torch.bfloat16, torch.float16):
            check(rows(special.to(dtype), [1.0, 0.5, 1.2, 0.8, 0.0], [0, 3, 80, 2, 0], 0.9, 0.05), 32, 16)
        check(rows(special, [0.0, 1.0, 1.0, 1.0, 1.0], 5, 0.3, 0.0), 64, 64)
        check(rows(torch.randn(3, 1, generator=gen), [1.0, 0.0, 2.0], [1, 0, 5], 0.5, 0.5), 16, 16)
        # Switches: use_top_k / use_top_p False ignore the rows' values (fewer launches).
        logits = (torch.randn(2, 200, generator=gen) * 3).to(torch.bfloat16)
        for flags in ((False, True), (True, False), (False, False)):
            check(rows(logits, 1.0, 5, 0.5, 0.0, flags), 64, 32)
        # The default tiling (one chunk, one block at this size).
        args = rows(torch.randn(2, 1000, generator=gen).to(torch.bfloat16), 0.9, 40, 0.9, 0.01)
        assert torch.equal(sample_kernels.sample(*args), sample_reference(*args))
        # Tiny temperatures beside a sampled row, down to fp32's smallest subnormal (whose 1 / T overflows to inf
        # without the 2**-100 floor, and (x - m) * inf is NaN at the maximum): the row's argmax, with and without
        # the top-k / top-p passes.
        tiny = torch.randn(4, 70, generator=gen)
        for k, top_p in ((0, 1.0), (5, 0.9)):
            got = check(rows(tiny, [1e-45, 1e-38, 1.0, 2.0**-100], k, top_p, 0.0), 32, 16)
            assert got[[0, 1, 3]].tolist() == tiny.argmax(dim=-1)[[0, 1, 3]].tolist(), got

    def row_path():
        """Which rows the row path decides (``radix=False`` leaves -1 for the others), and that its tokens are the
        reference's: sampled top-k rows with few candidates, and top-p rows whose candidates hold top_p of the mass;
        not greedy rows, rows with neither filter, a k past the capacity, a row whose ties put more tokens than the
        capacity at its bound, or a row without a finite maximum."""
        gen = torch.Generator().manual_seed(6)
        logits = (torch.randn(8, 4096, generator=gen) * 3).to(torch.bfloat16)  # 128 blocks of 32
        logits[6] = 1.5  # every token tied at the bound: 128 live blocks, 4,096 candidates
        logits[7, 100] = math.inf
        temperature, top_k = [0.8, 0.0, 0.8, 0.8, 1.0, 0.7, 0.9, 1.0], [50, 50, 0, 100, 1, 20, 3, 5]
        args = rows(logits, temperature, top_k, [0.9, 0.9, 0.9, 0.9, 1.0, 0.5, 1.0, 0.9],
                    [0.0, 0.0, 0.0, 0.02, 0.0, 0.1, 0.0, 0.0])
        want = sample_reference(*args)
        values = logits.float()

        def candidates(i):  # the tokens at or above the row's k-th largest logit (ties at the bound included)
            return int((values[i] >= values[i].topk(top_k[i]).values[-1]).sum())

        def row_path_takes(capacity):  # sampled top-k rows with a finite maximum and at most `capacity` candidates
            return [i for i in range(8) if temperature[i] > 0 and 0 < top_k[i] <= capacity
                    and bool(values[i].max().isfinite()) and candidates(i) <= capacity]

        # the case holds what it is for: ties past k at the bound (row 0), candidates between the two capacities
        # (row 3), every token tied (row 6)
        assert candidates(0) > top_k[0] and 64 < candidates(3) <= 256 and candidates(6) == 4096
        for capacity, takes in ((64, row_path_takes(64)), (256, row_path_takes(256))):
            got = sample_kernels.sample(*args, chunk=512, block=32, row_candidates=capacity, radix=False)
            taken = [i for i, token in enumerate(got.tolist()) if token >= 0]
            assert taken == takes, (capacity, got.tolist())
            assert torch.equal(got[takes], want[takes]), (got.tolist(), want.tolist())
            assert torch.equal(sample_kernels.sample(*args, chunk=512, block=32, row_candidates=capacity), want)
        # Top-p alone (the implicit k, TOP_P_CANDIDATES_K = 256, over 272 blocks of 16): taken when the candidates hold
        # top_p of the row's mass (peaked rows 0 and 1), left to the radix passes when they do not (the flat row 2);
        # with use_top_k on and off.
        spread = torch.tensor([[6.0], [6.0], [1.0], [6.0]])
        peaked = (torch.randn(4, 4352, generator=gen) * spread).to(torch.bfloat16)
        args = rows(peaked, [0.8, 1.0, 0.8, 0.0], 0, [0.9, 0.5, 0.9, 0.9], [0.0, 0.02, 0.0, 0.0])[:7]
        # float64: the mass the 256 largest logits hold at the row's temperature, past top_p in rows 0 and 1 only
        mass = [float(torch.softmax(peaked[i].double() / t, -1).topk(sample_kernels.TOP_P_CANDIDATES_K).values.sum())
                for i, t in ((0, 0.8), (1, 1.0), (2, 0.8))]
        assert mass[0] > 0.9 and mass[1] > 0.5 and mass[2] < 0.9, mass
        for flags in ((True, True), (False, True)):
            want = sample_reference(*args, *flags)
            got = sample_kernels.sample(*args, *flags, chunk=256, block=16, radix=False)
            assert [i for i, token in enumerate(got.tolist()) if token >= 0] == [0, 1], (flags, got.tolist())
            assert torch.equal(got[:2], want[:2]), (got.tolist(), want.tolist())
            assert torch.equal(sample_kernels.sample(*args, *flags, chunk=256, block=16), want)

    def batch_invariance():
        gen = torch.Generator().manual_seed(4)
        logits = (torch.randn(6, 150, generator=gen) * 2).to(torch.bfloat16)
        args = rows(logits, [0.0, 1.0, 0.6, 1.3, 1.0, 0.8], [0, 10, 0, 3, 150, 20], [1.0, 0.9, 0.5, 1.0, 0.8, 0.95],
                    [0.0, 0.0, 0.1, 0.0, 0.02, 0.0])
        together = sample_kernels.sample(*args, chunk=32, block=16)
        for i in range(6):
            alone = sample_kernels.sample(*(a[i : i + 1] if torch.is_tensor(a) else a for a in args), chunk=32,
                                          block=16)
            assert alone.item() == together[i].item(), (i, alone, together)
        perm = torch.tensor([3, 0, 5, 1, 4, 2])
        permuted = sample_kernels.sample(*(a[perm] if torch.is_tensor(a) else a for a in args), chunk=32, block=16)
        assert torch.equal(permuted, together[perm])

    def pointer_alignment():
        """Every tensor a kernel of the op gets starts on a 16-byte boundary, at the model's vocabulary and every row
        count from 1 to 9 (the workspace's views included): Triton compiles a variant per pointer alignment, so an
        offset that followed the row count would compile the kernels again for each remainder (the launches are
        recorded, not run)."""
        misaligned = []

        class Recorder:
            def __init__(self, name):
                self.name = name

            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    for i, arg in enumerate(list(args) + list(kwargs.values())):
                        if torch.is_tensor(arg) and arg.data_ptr() % 16:
                            misaligned.append((self.name, i, arg.data_ptr() % 16))
                return launch

        names = [n for n in dir(sample_kernels) if n.startswith("_sample_") and n.endswith("_kernel")]
        saved = {n: getattr(sample_kernels, n) for n in names}
        try:
            for n in names:
                setattr(sample_kernels, n, Recorder(n))
            for rows in range(1, 10):
                for dtype in (torch.bfloat16, torch.float32):
                    logits = torch.zeros(rows, 248320, dtype=dtype)
                    temperature, top_p, min_p = (torch.full((rows,), v) for v in (0.8, 0.9, 0.0))
                    top_k, seeds, counters = (torch.full((rows,), v, dtype=torch.int64) for v in (50, 1, 0))
                    sample_kernels.sample(logits, temperature, top_k, top_p, min_p, seeds, counters)
        finally:
            for n, kernel in saved.items():
                setattr(sample_kernels, n, kernel)
        assert len(names) == 6 and not misaligned, (names, misaligned[:10])

    groups = {
        "pointer_alignment": {"pointer_alignment": pointer_alignment},
        "hypothesis_small_vocab": {"hypothesis_small_vocab": lambda: hypothesis_check(st.integers(1, 64), 30)},
        "hypothesis_large_vocab": {"hypothesis_large_vocab": lambda: hypothesis_check(st.integers(65, 3000), 8)},
        # The hand-picked cases, in smaller groups than before (the longest, row_path, ~6 minutes of interpreter on
        # one core; ties_and_boundaries was ~7-9), so that each child stays below its 600 s timeout when it shares the
        # cores with the rest of the suite (tests/background.py).
        "ties_and_small_k": {"ties_and_small_k": ties_and_small_k},
        "block_skipping_small_k": {"block_skipping_small_k": lambda: block_skipping(
            ((torch.bfloat16, 1), (torch.bfloat16, 7), (torch.float32, 7)))},
        "block_skipping_k_at_block_count": {"block_skipping_k_at_block_count": lambda: block_skipping(
            ((torch.bfloat16, 125), (torch.bfloat16, 126)))},
        "boundaries": {"boundaries": boundaries},
        "special_rows_and_batch_invariance": {"special_rows": special_rows, "batch_invariance": batch_invariance},
        "row_path": {"row_path": row_path},
    }
    results = {}
    for name, fn in groups[group].items():
        try:
            fn()
            results[name] = None
        except Exception as exc:  # reported to the parent, which fails that test with this message
            results[name] = f"{type(exc).__name__}: {exc}"
    return results


# ----------------------------------------------------------------------------------------------------------------
# Parent: pytest tests.
# ----------------------------------------------------------------------------------------------------------------


# Longest first: the background thread (tests/background.py) runs them in this order.
GROUPS = ["block_skipping_k_at_block_count", "row_path", "special_rows_and_batch_invariance", "boundaries",
          "block_skipping_small_k", "ties_and_small_k", "hypothesis_large_vocab", "hypothesis_small_vocab",
          "pointer_alignment"]


def _argv(group: str) -> list[str]:
    return [sys.executable, __file__, "--child", group]


@pytest.mark.parametrize("group", [pytest.param(g, marks=pytest.mark.background_child(_argv(g))) for g in GROUPS])
def test_sample_kernel_matches_reference_in_interpreter(group):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    failures = {name: error for name, error in background.child_json(_argv(group)).items() if error is not None}
    assert not failures, failures


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("run with TRITON_INTERPRET=1")
    sys.path.insert(0, str(REPO))
    from tests import interpreter

    interpreter.install()  # Triton's interpreter without its repeated patching
    print(json.dumps(_child_checks(sys.argv[2])))
