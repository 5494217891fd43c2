"""``ce::gated_deltanet_verify`` and ``ce::gated_deltanet_commit`` (ops/gated_deltanet_verify.py) on the CPU.

Oracle: P = k + 1 applications in a row of ``ce::gated_deltanet_decode``'s reference (itself checked against float64
formulas in tests/test_ops.py) on clones of the pools: the verify's outputs are those applications' outputs and it
leaves the pools as they are; after the commit of ``a`` accepted drafts, a live sequence's pool rows equal what the
applications left after position ``a``, and every other slot but the null slot is untouched.

* the references against the oracle (hypothesis: k in 1..4, sequences with padding rows on the null slot, random
  accepted counts, bf16 / fp32 activations and pools, value heads 1-3x the key heads, a history wider than the step);
* the Triton kernels against the oracle under ``TRITON_INTERPRET=1``, in a child process (the parent never imports
  triton; the interpreter has no bfloat16, so fp32): the same hypothesis cases, fewer of them.
The GPU check on the model's shapes is tests/test_kernels_cuda.py ``test_gated_deltanet_verify_matches_reference``.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from tests import background

REPO = Path(__file__).resolve().parents[1]
LAYOUTS = [(2, 2, 16, 8), (1, 3, 8, 12), (2, 4, 12, 8)]  # (Hk, Hv, K, V): ratios 1, 3 and 2; K, V not all powers of 2
WIDTH = 4


def make_case(seed: int, layout, k: int, live: int, padding: int, accepted: list[int], dtype, state_dtype,
              extra_rows: int = 1, extra_positions: int = 1, layers: int = 1) -> dict:
    """Inputs of one verify step and commit of ``layers`` linear layers: ``live`` sequences on distinct random slots
    then ``padding`` rows on the null slot, k + 1 positions each, projected rows a slice of wider rows; each layer its
    own weights, pools, rows and history (``layer`` entries), the slots and accepted counts shared."""
    from ops import layouts

    gen = torch.Generator().manual_seed(seed)

    def randn(*shape, scale=1.0, dt=torch.float32):
        return (torch.randn(*shape, generator=gen) * scale).to(dt)

    hk, hv, dk, dv = layout
    sizes = layouts.gated_deltanet_split_sizes(hk, dk, hv, dv)
    channels, n, positions = sum(sizes[:3]), live + padding, k + 1
    num_slots = live + 3
    slots = torch.cat([torch.randperm(num_slots - 1, generator=gen)[:live] + 1, torch.zeros(padding, dtype=torch.long)])
    width = layouts.gated_deltanet_history_offsets(hk, dk, hv, dv)[3]

    def layer() -> dict:
        projected = randn(n * positions, sum(sizes) + 7, dt=dtype)[:, 3:-4]
        projected[:, -2 * hv :] *= 3  # b and a: gates away from 1/2
        return dict(
            projected=projected, conv_weight=randn(channels, WIDTH, scale=0.5, dt=dtype),
            conv_state=randn(num_slots, channels, WIDTH - 1, dt=dtype), A_log=randn(hv, scale=0.5), dt_bias=randn(hv),
            norm_weight=randn(dv, dt=dtype) + 1,
            recurrent_state=randn(num_slots, hv, dk, dv, scale=0.5, dt=state_dtype),
            history=torch.full((n + extra_rows, positions + extra_positions, width), float("nan")),
        )

    return dict(
        layer=[layer() for _ in range(layers)], state_slots=slots.to(torch.int32),
        num_accepted=torch.tensor(accepted + [0] * padding, dtype=torch.long)[:n], heads=(hk, dk, hv, dv),
        positions=positions, live=live,
    )


def check_case(case: dict, verify, commit, tol: dict) -> None:
    """``verify`` (each layer) and ``commit`` (every layer at once), the references or the kernels, on ``case``
    against the decode oracle."""
    from ops.gated_deltanet_decode import gated_deltanet_decode_reference

    n, positions, live = case["state_slots"].shape[0], case["positions"], case["live"]
    heads, eps, slots = case["heads"], 1e-6, case["state_slots"]
    pools, after = [], []
    for c in case["layer"]:
        conv, rec = c["conv_state"].clone(), c["recurrent_state"].clone()
        # The oracle: P decode steps in a row on clones of the pools, the pools after each kept.
        want_conv, want_rec = conv.clone(), rec.clone()
        per_position = c["projected"].view(n, positions, -1)
        outputs, states = [], []
        for i in range(positions):
            outputs.append(gated_deltanet_decode_reference(
                per_position[:, i], c["conv_weight"], want_conv, c["A_log"], c["dt_bias"], c["norm_weight"], want_rec,
                slots, *heads, eps))
            states.append((want_conv.clone(), want_rec.clone()))
        want = torch.stack(outputs, dim=1).reshape(n * positions, -1)

        got = verify(c["projected"], c["conv_weight"], conv, c["A_log"], c["dt_bias"], c["norm_weight"], rec, slots,
                     c["history"], *heads, eps)
        assert got.shape == want.shape and got.dtype == want.dtype and got.is_contiguous()
        rows = live * positions  # live sequences lead
        torch.testing.assert_close(got[:rows], want[:rows], **tol, msg=lambda m: f"verify outputs: {m}")
        assert torch.equal(conv, c["conv_state"]) and torch.equal(rec, c["recurrent_state"]), "verify wrote a pool"
        pools.append((conv, rec))
        after.append(states)

    commit([conv for conv, _ in pools], [rec for _, rec in pools], slots, [c["history"] for c in case["layer"]],
           case["num_accepted"], *heads)
    for c, (conv, rec), states in zip(case["layer"], pools, after):
        for slot, accepted in zip(slots[:live].tolist(), case["num_accepted"][:live].tolist()):
            torch.testing.assert_close(conv[slot], states[accepted][0][slot], atol=0, rtol=0,
                                       msg=lambda m: f"committed conv state: {m}")
            torch.testing.assert_close(rec[slot], states[accepted][1][slot], **tol,
                                       msg=lambda m: f"committed recurrent state: {m}")
        others = [s for s in range(1, conv.shape[0]) if s not in slots.tolist()]
        assert torch.equal(conv[others], c["conv_state"][others])
        assert torch.equal(rec[others], c["recurrent_state"][others])


@st.composite
def cases(draw, dtypes=(torch.float32, torch.bfloat16)):
    k = draw(st.integers(1, 4))
    live = draw(st.integers(1, 3))
    return dict(
        seed=draw(st.integers(0, 2**31 - 1)), layout=draw(st.sampled_from(LAYOUTS)), k=k, live=live,
        padding=draw(st.integers(0, 2)), accepted=draw(st.lists(st.integers(0, k), min_size=live, max_size=live)),
        dtype=draw(st.sampled_from(dtypes)), state_dtype=draw(st.sampled_from((torch.float32,) + dtypes[1:])),
        extra_rows=draw(st.integers(0, 2)), extra_positions=draw(st.integers(0, 2)), layers=draw(st.integers(1, 3)),
    )


@given(params=cases())
@settings(max_examples=25, deadline=None)
def test_references_equal_decode_steps_in_a_row(params):
    """The references: outputs and committed states bit for bit (the same fp32 operations in the same order)."""
    from ops.gated_deltanet_verify import gated_deltanet_commit_reference, gated_deltanet_verify_reference

    check_case(make_case(**params), gated_deltanet_verify_reference, gated_deltanet_commit_reference,
               dict(atol=0, rtol=0))


def test_registered_ops_equal_decode_steps_in_a_row():
    """The same through ``torch.ops.ce`` (the CPU dispatch), every accepted count of a k = 3 step, two layers."""
    ce = torch.ops.ce
    case = make_case(7, LAYOUTS[1], 3, 4, 1, [0, 1, 2, 3], torch.float32, torch.float32, layers=2)
    check_case(case, ce.gated_deltanet_verify, ce.gated_deltanet_commit, dict(atol=0, rtol=0))


def test_verify_refuses_a_history_too_small():
    ce = torch.ops.ce
    case = make_case(3, LAYOUTS[0], 2, 2, 0, [0, 0], torch.float32, torch.float32)
    c = case["layer"][0]
    with pytest.raises(ValueError, match="history"):  # 2 positions for a 3-position step
        ce.gated_deltanet_verify(c["projected"], c["conv_weight"], c["conv_state"], c["A_log"], c["dt_bias"],
                                 c["norm_weight"], c["recurrent_state"], case["state_slots"], c["history"][:, :2],
                                 *case["heads"], 1e-6)


# ----------------------------------------------------------------------------------------------------------------
# The Triton kernels under the interpreter (child process)
# ----------------------------------------------------------------------------------------------------------------

INTERPRETER_EXAMPLES = 12


def _child() -> dict:
    from ops.triton import gated_deltanet_kernels as kernels

    failures = []

    @given(params=cases(dtypes=(torch.float32,)))
    # No shrinking: under the interpreter it would run for minutes; the first failing example is reported as drawn.
    @settings(max_examples=INTERPRETER_EXAMPLES, deadline=None, database=None, derandomize=bool(os.environ.get("CI")),
              phases=(Phase.explicit, Phase.reuse, Phase.generate))
    def run(params):
        try:
            check_case(make_case(**params), kernels.gated_deltanet_verify, kernels.gated_deltanet_commit,
                       dict(atol=1e-4, rtol=1e-4))
        except Exception as exc:
            failures.append(f"{params}: {type(exc).__name__}: {exc}")
            raise

    try:
        run()
        # every accepted count of a k = 4 step, Hv = 3 Hk, a wider history, 4 layers
        check_case(make_case(11, LAYOUTS[1], 4, 5, 2, [0, 1, 2, 3, 4], torch.float32, torch.float32, 2, 1, 4),
                   kernels.gated_deltanet_verify, kernels.gated_deltanet_commit, dict(atol=1e-4, rtol=1e-4))
        # value heads split over programs in column blocks, the norm a second launch or (split_norm) by each key
        # head's last program to count itself in: a ragged last block (V = 12 in blocks of 8, three value heads a key
        # head), and whole blocks of 4 (two value heads a key head); the commit reads what only block 0 writes (conv
        # inputs of q and k, keys, decays)
        for layout, block_v, accepted in ((LAYOUTS[1], 8, [2, 0]), (LAYOUTS[2], 4, [1, 3])):
            for split_norm in (False, True):
                check_case(make_case(12, layout, 3, 2, 1, accepted, torch.float32, torch.float32, layers=2),
                           functools.partial(kernels.gated_deltanet_verify, block_v=block_v, num_warps=2,
                                             split_norm=split_norm),
                           kernels.gated_deltanet_commit, dict(atol=1e-4, rtol=1e-4))
        counts = kernels._counters[torch.device("cpu")]
        assert int(counts.abs().sum()) == 0, "the split norm's launches must leave their counts at zero"
    except Exception as exc:
        return {"error": failures[-1] if failures else f"{type(exc).__name__}: {exc}"}
    return {"error": None}


CHILD_ARGV = [sys.executable, __file__, "--child"]


@pytest.fixture(scope="module")
def interpreter_result() -> dict:
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    return background.child_json(CHILD_ARGV)


@pytest.mark.background_child(CHILD_ARGV)  # started in the background: tests/background.py
def test_kernels_equal_decode_steps_in_a_row_in_interpreter(interpreter_result):
    assert interpreter_result["error"] is None, interpreter_result["error"]


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    sys.path.insert(0, str(REPO))
    from tests import interpreter

    interpreter.install()  # Triton's interpreter without its repeated patching
    import ops  # noqa: F401  (registers the ops)

    print(json.dumps(_child()))
