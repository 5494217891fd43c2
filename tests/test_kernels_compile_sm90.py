"""The Triton kernels of ``ce::sample``, the penalties, the MoE ops, the skinny GEMM, the decode attention and the Gated
DeltaNet decode and verify compiled for the H200 (sm_90) on a CPU machine: Triton's frontend and ptxas, no GPU. The
interpreter tests run these kernels' logic in NumPy, which accepts programs that Triton's compiler rejects (a name
rebound to a value of another type inside a loop, for one), so a kernel that passes them can still fail at its first
launch on a GPU; this compiles every variant the launchers use (bf16 and fp32 logits, each filter switch, the row
path on and off, ...) the way the GPU would, and checks what the PTX must hold where a kernel's protocol depends on
it.

The checks (``check_*``) run in two child processes without ``TRITON_INTERPRET`` (``PARTS``), started in the
background when collection ends (tests/background.py: they are ~3 minutes of single-threaded compiling on a CPU
machine); each pytest test asserts one check's result.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import sys
import tempfile
import traceback
from pathlib import Path

import pytest

from tests import background

REPO = Path(__file__).resolve().parents[1]


def _compile(fn, signature: dict, constexprs: dict, num_warps: int = 4):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    full = {name: "constexpr" if name in constexprs else signature[name] for name in names}
    source = ASTSource(fn=fn, signature=full, constexprs={(names.index(k),): v for k, v in constexprs.items()})
    return triton.compile(source, target=GPUTarget("cuda", 90, 64),
                          options={"num_warps": num_warps, "enable_fp_fusion": False})


def _ptr(dtype):
    return "*" + dtype


ROW = dict(stride_row="i64", V="i32", temperature=_ptr("fp32"), top_k=_ptr("i64"), top_p=_ptr("fp32"),
           min_p=_ptr("fp32"), seeds=_ptr("i64"), counters=_ptr("i64"), num_chunks="i32", chunk_max=_ptr("i64"),
           num_blocks="i32", block_max=_ptr("i64"), live_list=_ptr("i64"), live_stride="i32", cand_x=_ptr("fp32"),
           cand_i=_ptr("i32"), mass_part=_ptr("i64"), handled=_ptr("i32"), out=_ptr("i64"), shift="i32",
           part_in=_ptr("i64"), state_in=_ptr("i64"), part_out=_ptr("i64"), state_out=_ptr("i64"),
           topk_part=_ptr("i64"), topk_state=_ptr("i64"), topp_part=_ptr("i64"), topp_state=_ptr("i64"),
           best_score=_ptr("fp32"), best_index=_ptr("i32"), greedy_value=_ptr("fp32"), greedy_index=_ptr("i32"))


def check_sample_kernels(logits, shift):
    from ops.triton import sample_kernels as sk

    sig = dict(ROW, logits=_ptr(logits))
    common = dict(SHIFT=shift, BLOCK=256, CHUNKS_P=64, USE_PDL=True)
    key_bits = 32 - shift
    for use_top_k, use_top_p in ((True, True), (False, True), (True, False)):
        _compile(sk._sample_row_kernel, sig, dict(common, KEY_BITS=key_bits, USE_TOP_K=use_top_k, USE_TOP_P=use_top_p,
                 IMPLICIT_K=sk.TOP_P_CANDIDATES_K, GATHER=sk.GATHER, CAND=sk.ROW_CANDIDATES, BLOCKS_P=1024),
                 num_warps=8)
    _compile(sk._sample_mass_kernel, sig, dict(USE_TOP_K=True, CHUNK=4096, BLOCK=256, CHUNKS_P=64, USE_PDL=True))
    for mass, topk_start, start, after_start in ((False, True, False, False), (False, False, False, False),
                                                (True, False, True, False), (True, False, False, True)):
        for row_path in (True, False):
            _compile(sk._sample_radix_kernel, sig, dict(common, KEY_BITS=key_bits, MASS=mass, TOPK_START=topk_start,
                     START=start, AFTER_START=after_start, USE_TOP_K=True, ROW_PATH=row_path, CHUNK=4096,
                     BLOCKS_P=1024))
    for row_path in (True, False):
        _compile(sk._sample_final_kernel, sig, dict(common, USE_TOP_K=True, USE_TOP_P=True, ROW_PATH=row_path,
                 CHUNK=4096))
        _compile(sk._sample_reduce_kernel, sig, dict(ROW_PATH=row_path, CHUNKS_P=64, USE_PDL=True))


def check_penalty_kernel():
    from ops.triton import penalty_kernels as pk

    sig = dict(logits=_ptr("fp32"), stride_row="i64", rows=_ptr("i64"), stride_rows="i64", codes=_ptr("i32"),
               V="i32", presence=_ptr("fp32"), stride_presence="i64", frequency=_ptr("fp32"), stride_frequency="i64",
               repetition=_ptr("fp32"), stride_repetition="i64")
    _compile(pk._apply_penalties_kernel, sig, dict(IN_PROMPT=pk.IN_PROMPT, BLOCK=pk.BLOCK))


def check_moe_routing_kernels():
    from ops.triton import moe_kernels as mk

    sig = dict(logits=_ptr("bf16"), weights=_ptr("fp32"), ids=_ptr("i32"), sorted_rows=_ptr("i32"),
               block_experts=_ptr("i32"), num_padded=_ptr("i32"), num_tokens="i32", num_experts="i32",
               stride_row="i32", length="i32", num_blocks="i32", num_rows="i32")
    for renormalize in (True, False):
        _compile(mk._moe_route_kernel, sig, dict(TOP_K=8, BLOCK_E=256, BLOCK_K=8, RENORMALIZE=renormalize),
                 num_warps=1)
    _compile(mk._moe_align_kernel, sig, dict(BLOCK_M=16, BLOCK_E=256, CHUNK=32))


def check_moe_expert_gemv_kernels():
    from ops.triton import moe_kernels as mk

    sig = dict(x=_ptr("bf16"), w=_ptr("bf16"), act=_ptr("bf16"), out=_ptr("bf16"), weights=_ptr("fp32"),
               ids=_ptr("i32"), inter="i32", hidden="i32", stride_x="i32", stride_we="i32", stride_wn="i32",
               stride_act="i32", stride_out="i32")
    config = mk.moe_gemv_config(2048, 512)
    extra = {"gate_up": {}, "down": {"BLOCK_J": 8}}
    for name, kernel in (("gate_up", mk._moe_gemv_gate_up_kernel), ("down", mk._moe_gemv_down_kernel)):
        tiles = config[name]
        _compile(kernel, sig, dict(TOP_K=8, BLOCK_N=tiles["block_n"], BLOCK_K=tiles["block_k"], **extra[name]),
                 num_warps=tiles["num_warps"])


def check_skinny_gemm_rule(rows):
    """ce::linear's skinny GEMM at every config the rule gives the model's weight shapes (N = 1,024 outputs of K =
    2,048 or 3,584, the wide K = 1,024 ones, the vocabulary), plain and with the SiLU gate (and at one row the norm
    prologue), the wide ones with the SiLU gate in the epilogue too (``GATED_OUT``, the MLP's gate_up), as
    ``_launch`` sets its constexprs: at 3 and 5 rows the power of two below and the last row apart (``EXTRA_ROW``);
    at one row without masks where the tiles are full (``FULL``: all but K = 3,584)."""
    from ops.triton import gemv_kernels as gk

    sig = dict(x=_ptr("bf16"), weight=_ptr("bf16"), out=_ptr("bf16"), M="i32", N="i32", K="i32",
               stride_x_m="i32", stride_x_k="i32", stride_w_n="i32", stride_w_k="i32", stride_o_m="i32",
               stride_o_n="i32", residual=_ptr("bf16"), norm_weight=_ptr("bf16"), summed=_ptr("bf16"),
               stride_r_m="i32", eps="fp32", prefetch_programs="i32")
    for n, k in ((1024, 2048), (1024, 3584), (8192, 1024), (248320, 1024)):
        config = gk.skinny_config(rows, n, k)
        tiles = gk.row_tiles(rows, config)
        assert tiles["EXTRA_ROW"] == (rows in (3, 5) and not tiles["DOT"])
        assert gk.full_tiles(rows, n, k, config, tiles) == (rows == 1 and k != 3584)
        # the SiLU epilogue wherever the GEMV loops run (ops/linear.py falls back to ce::silu_mul elsewhere)
        assert gk.takes_gated_out(rows, n, k) == (not tiles["DOT"]) and not gk.takes_gated_out(rows, n + 1, k)
        variants = [(False, False, False), (True, False, False)] + ([(False, True, False)] if rows == 1 else [])
        if n == 8192:  # gate_up's kind
            variants += [(False, rows == 1, True)]
        for gated, norm, gated_out in variants:
            _compile(gk._skinny_gemm_kernel, sig,
                     dict(config.kwargs, **tiles, FULL=gk.full_tiles(rows, n, k, config, tiles), GATED_X=gated,
                          NORM_X=norm, GATED_OUT=gated_out, NORM_BLOCK=1024 if norm else 1,
                          USE_PDL=True, PREFETCH_L2=True),
                     num_warps=config.num_warps)


# The Gated DeltaNet kernels' arguments but their constexprs: bf16 rows and weights, an fp32 state pool.
GDN_SIG = dict(projected=_ptr("bf16"), conv_weight=_ptr("bf16"), conv_state=_ptr("bf16"), A_log=_ptr("fp32"),
               dt_bias=_ptr("fp32"), norm_weight=_ptr("bf16"), recurrent_state=_ptr("fp32"), state_slots=_ptr("i32"),
               out=_ptr("bf16"), counters=_ptr("i32"), scale="fp32", eps="fp32",
               **{name: "i64" for name in ("stride_p_b", "stride_p_c", "stride_w_c", "stride_w_k", "stride_cs_slot",
                                           "stride_cs_c", "stride_cs_k", "stride_rs_slot", "stride_rs_h",
                                           "stride_rs_k", "stride_rs_v")})


def _state_order(ptx: str, param: str, mark_wait: bool = False) -> str:
    """The global loads (R) and stores (W) of one pointer parameter's tensor, in PTX order: those whose address
    derives from ``param`` (followed through every instruction that reads a register derived from it); with
    ``mark_wait``, a ``|`` where the PDL wait (``griddepcontrol.wait``) stands."""
    derived, order = set(), []
    for line in ptx.splitlines():
        line = re.sub(r"^@!?%\w+\s+", "", line.strip())  # a predicate
        registers = re.findall(r"%\w+", line)
        if mark_wait and line.startswith("griddepcontrol.wait"):
            order.append("|")
        elif line.startswith("ld.param") and line.rstrip(";").endswith(f"[{param}]"):
            derived.add(registers[0])
        elif line.startswith(("ld.global", "st.global")):
            if re.search(r"\[\s*(%\w+)", line).group(1) in derived:
                order.append("R" if line.startswith("ld") else "W")
        elif len(registers) >= 2 and any(r in derived for r in registers[1:]):
            derived.add(registers[0])
    return "".join(order)


def check_gated_deltanet_decode_launches(group):
    """Every launch of ``DECODE_LAUNCHES`` (whole heads, and the V tiles whose norm reads the parked outputs back), at
    Qwen3.5-0.8B's linear-attention shape (GROUP 1) and Qwen3-Next's (GROUP 2), bf16 rows and an fp32 state pool,
    with the walk's prefetch on and off. The state pool's loads and stores in the PTX: with the prefetch, each tile's
    loads come before the previous tile's stores (R R W R W .. W W, a letter a tile); without, in walk order."""
    from ops.triton import gated_deltanet_kernels as gk

    shape = dict(NUM_K_HEADS=16, NUM_V_HEADS=16 * group, GROUP=group, DK=128, DV=128, WIDTH=4, HIST_P=4, BLOCK_K=128,
                 ROUND_WEIGHT_PRODUCT=True, USE_PDL=True)
    state_param = f"{gk._gated_deltanet_decode_kernel.__name__}_param_" + str(
        gk._gated_deltanet_decode_kernel.arg_names.index("recurrent_state"))
    for _, block_v, warps, _, _ in gk.DECODE_LAUNCHES:
        block_v = block_v or 128
        tiles = group * 128 // block_v
        for prefetch in (True, False):
            kernel = _compile(gk._gated_deltanet_decode_kernel, GDN_SIG,
                              dict(shape, BLOCK_V=block_v, V_BLOCKS=128 // block_v, WALK_BLOCKS=128 // block_v,
                                   SPLIT_V=False, BLOCK_HEAD=128, PREFETCH=prefetch), num_warps=warps)
            order = _state_order(kernel.asm["ptx"], state_param)
            per_tile = len(order) // (2 * tiles)
            r, w = "R" * per_tile, "W" * per_tile
            want = r + (r + w) * (tiles - 1) + w if prefetch else (r + w) * tiles
            assert per_tile > 0 and order == want, (block_v, warps, prefetch, order)


def check_gated_deltanet_decode_split_v(group):
    """The decode kernel with each value head's V tiles over programs (``SPLIT_V``, tiles of 32 at 4 warps): one tile
    of each of the G value heads a program, loaded and stored once (R .. W per head, in walk order); the count a
    single acquire-release atomic at GPU scope, its result shared by the program's threads."""
    from ops.triton import gated_deltanet_kernels as gk

    kernel = _compile(gk._gated_deltanet_decode_kernel, GDN_SIG,
                      dict(NUM_K_HEADS=16, NUM_V_HEADS=16 * group, GROUP=group, DK=128, DV=128, WIDTH=4, HIST_P=4,
                           BLOCK_K=128, ROUND_WEIGHT_PRODUCT=True, USE_PDL=True, BLOCK_V=32, V_BLOCKS=4,
                           WALK_BLOCKS=1, SPLIT_V=True, BLOCK_HEAD=128, PREFETCH=False), num_warps=4)
    ptx = kernel.asm["ptx"]
    state_param = f"{gk._gated_deltanet_decode_kernel.__name__}_param_" + str(
        gk._gated_deltanet_decode_kernel.arg_names.index("recurrent_state"))
    order = _state_order(ptx, state_param)
    per_tile = len(order) // (2 * group)
    assert per_tile > 0 and order == ("R" * per_tile + "W" * per_tile) * group, order
    atomics = [line for line in ptx.splitlines() if "atom." in line]
    assert len(atomics) == 1 and "acq_rel" in atomics[0] and ".gpu" in atomics[0], atomics


def check_gated_deltanet_verify_launches(group, block_v, warps, split_norm):
    """The verify kernel at k = 2 with whole heads (the norm in the kernel) and with each head's columns split over
    programs, the norm a second launch or by each key head's last program (``split_norm``; ``VERIFY_LAUNCHES`` picks
    among these), at GROUP 1 and 2, bf16 rows and an fp32 state pool. The split norm's count is one acquire-release
    atomic at GPU scope, after the wait."""
    from ops.triton import gated_deltanet_kernels as gk

    sig = dict(GDN_SIG, history=_ptr("fp32"), stride_h_seq="i64", stride_h_pos="i64")
    for pdl in (True, False):
        kernel = _compile(gk._gated_deltanet_verify_kernel, sig,
                          dict(POSITIONS=3, NUM_K_HEADS=16, NUM_V_HEADS=16 * group, GROUP=group, DK=128, DV=128,
                               WIDTH=4, WIDTH_P=4, BLOCK_K=128, BLOCK_V=block_v, V_BLOCKS=128 // block_v,
                               SPLIT_NORM=split_norm, BLOCK_HEAD=128, ROUND_WEIGHT_PRODUCT=True, USE_PDL=pdl),
                          num_warps=warps)
        ptx = kernel.asm["ptx"]
        atomics = [line for line in ptx.splitlines() if "atom." in line]
        assert len(atomics) == split_norm and all("acq_rel" in a and ".gpu" in a for a in atomics), atomics
        if not pdl:
            assert "griddepcontrol" not in ptx
            continue
        # ops/triton/pdl.py's protocol: dependents launched first; before the wait only the first value head's state
        # tile (and the weights, the slot); the projected rows read, and every store, after it
        name = gk._gated_deltanet_verify_kernel.__name__
        param = {arg: f"{name}_param_{i}" for i, arg in enumerate(gk._gated_deltanet_verify_kernel.arg_names)}
        lines = [line.strip() for line in ptx.splitlines()]
        launch = next(i for i, line in enumerate(lines) if line.startswith("griddepcontrol.launch_dependents"))
        wait = next(i for i, line in enumerate(lines) if line.startswith("griddepcontrol.wait"))
        assert launch < wait
        state = _state_order(ptx, param["recurrent_state"], mark_wait=True)
        rows = _state_order(ptx, param["projected"], mark_wait=True)
        assert state.count("|") == 1 and "R" in state.split("|")[0], state  # the first state tile, under in_proj
        assert rows.startswith("|R"), rows  # the projected rows only after the wait
        assert "W" not in state and "W" not in rows  # the pools and rows are read only
        assert not any(re.match(r"(@!?%\w+\s+)?st\.global", line) for line in lines[:wait])  # no store before it
        assert all(i > wait for i, line in enumerate(lines) if "atom." in line)  # the count after the wait


def check_attention_decode_kernels():
    """``ce::attention_decode`` at the Qwen3.5-0.8B attention shape (8 query heads, 2 KV heads, D = 256, bf16 cache,
    64-token tiles): the split kernel with and without the early loads (each at the stages ``decode_stages`` gives and
    the splits ``decode_num_splits`` gives on an H100 or H200's 132 SMs) and with one split, and the reduce kernel at a
    program a query head (64 splits) and with the channels over 8 programs (64 and 128 splits, the warps
    ``reduce_splits`` gives), where ptxas spills nothing. (The split kernel does spill under Triton 3.9's compile,
    0.3-2.4 KB a thread at 255 registers: not asserted; bench/NOTES.md.)"""
    from bench.sass_stats import compile_sm90, stats
    from ops.triton import attention_decode_kernels as ak
    from ops.triton import paged_attention_kernels as pk

    pointers = dict(inv_freq="*fp32", positions="*i64", slot_mapping="*i64", block_tables="*i32",
                    context_lens="*i32", part_acc="*fp32", part_max="*fp32", part_sum="*fp32", scale_log2="fp32")
    shape = dict(NUM_Q_HEADS=8, NUM_KV_HEADS=2, GROUP=4, GROUP_P=4, HEAD_DIM=256, HEAD_DIM_P=256, ROTARY_HALF=32,
                 BLOCK_SIZE=16, BLOCK_N=64, DOT_FP32=False, USE_PDL=True)
    for batch, splits in ((1, 128), (8, 16), (64, 1)):  # the launcher's early loads and stages at each batch
        early = batch <= ak.EARLY_LOADS_MAX_BATCH
        kernel = compile_sm90(ak._attention_decode_kernel, dict(shape, NUM_SPLITS=splits, EARLY_LOADS=early), 4,
                              pointers, num_stages=ak.decode_stages(batch))
        assert kernel.asm["cubin"], (splits, early)
    reduce_pointers = dict(part_acc="*fp32", part_max="*fp32", part_sum="*fp32")
    for splits, parts in ((64, 1), (64, 8), (128, 8)):
        block_d = 256 // parts
        kernel = compile_sm90(pk._paged_decode_reduce_kernel,
                              dict(NUM_Q_HEADS=8, HEAD_DIM=256, HEAD_DIM_P=256, NUM_SPLITS=splits, NUM_SPLITS_P=splits,
                                   BLOCK_D=block_d, GATED=True, USE_PDL=True),
                              pk.reduce_warps(splits, block_d), reduce_pointers)
        assert stats(kernel)["spill_bytes"] == 0, (splits, parts)


def check_sass_stats_reports_a_verify_launch():
    """bench/sass_stats.py, the offline count behind the GDN kernels' barrier figures in bench/NOTES.md: ptxas's
    registers for one verify launch, and its SASS, where a 4-warp program's reductions over K (across warps) take
    barriers that a 1-warp program's (shuffles within the warp) do not."""
    from bench.sass_stats import compile_sm90, stats
    from ops.triton import gated_deltanet_kernels as gk

    common = dict(NUM_K_HEADS=16, NUM_V_HEADS=16, GROUP=1, DK=128, DV=128, WIDTH=4, WIDTH_P=4, BLOCK_K=128,
                  ROUND_WEIGHT_PRODUCT=True, USE_PDL=True, BLOCK_HEAD=128, POSITIONS=2, BLOCK_V=32, V_BLOCKS=4,
                  SPLIT_NORM=False)
    four, one = (stats(compile_sm90(gk._gated_deltanet_verify_kernel, common, warps, {"history": "*fp32"}))
                 for warps in (4, 1))
    assert 0 < four["registers"] <= 255 and four["spill_bytes"] == 0 and four["instructions"] > 0
    assert four["BAR"] > one["BAR"] + 20 and four["SHFL"] > 0


# ----------------------------------------------------------------------------------------------------------------
# The checks by name, run in the child; the parent's tests, one a check.
# ----------------------------------------------------------------------------------------------------------------


# (block_v, num_warps, split_norm) of each launch ops/triton/gated_deltanet_kernels.py's VERIFY_LAUNCHES gives (whole
# heads: 128), named here so that collection imports no Triton; the child checks they are the launches. The kernel's
# other tiles are checked on the GPU (tests/test_kernels_cuda.py).
VERIFY_TILES = ((32, 4, True), (128, 8, False), (64, 4, False))


def check_verify_tiles_are_the_launches():
    from ops.triton.gated_deltanet_kernels import VERIFY_LAUNCHES

    launches = {(block_v or 128, warps, split_norm) for _, block_v, warps, split_norm in VERIFY_LAUNCHES}
    assert launches == set(VERIFY_TILES), (launches, VERIFY_TILES)


def _checks() -> dict:
    checks = {f"sample_kernels_{logits}": functools.partial(check_sample_kernels, logits, shift)
              for logits, shift in (("bf16", 16), ("fp32", 0))}
    checks["penalty_kernel"] = check_penalty_kernel
    checks["moe_routing_kernels"] = check_moe_routing_kernels
    checks["moe_expert_gemv_kernels"] = check_moe_expert_gemv_kernels
    checks.update({f"skinny_gemm_rule_{rows}_rows": functools.partial(check_skinny_gemm_rule, rows)
                   for rows in (1, 2, 3, 4, 5)})
    for group in (1, 2):
        checks[f"gated_deltanet_decode_launches_group{group}"] = functools.partial(
            check_gated_deltanet_decode_launches, group)
        checks[f"gated_deltanet_decode_split_v_group{group}"] = functools.partial(
            check_gated_deltanet_decode_split_v, group)
        for block_v, warps, split_norm in VERIFY_TILES:
            name = f"gated_deltanet_verify_group{group}_v{block_v}_w{warps}" + ("_split_norm" * split_norm)
            checks[name] = functools.partial(check_gated_deltanet_verify_launches, group, block_v, warps, split_norm)
    checks["verify_tiles_are_the_launches"] = check_verify_tiles_are_the_launches
    checks["attention_decode_kernels"] = check_attention_decode_kernels
    checks["sass_stats_reports_a_verify_launch"] = check_sass_stats_reports_a_verify_launch
    return checks


# Two children of ~2 minutes each rather than one of ~4, so that the two threads of tests/background.py end about
# together: the sampling, penalty, MoE and skinny GEMM kernels; the Gated DeltaNet and attention kernels.
PARTS = ("sample_moe_gemm", "gdn_attention")


def _part(name: str) -> str:
    return PARTS[1] if name.startswith(("gated_deltanet", "verify", "attention", "sass")) else PARTS[0]


CHECK_NAMES = list(_checks())


def _argv(part: str) -> list[str]:
    return [sys.executable, __file__, "--child", part]


def _child(part: str) -> dict:
    """The part's checks, each on its own: None where it passed, else its traceback's end."""
    results = {}
    for name, check in _checks().items():
        if _part(name) != part:
            continue
        try:
            check()
            results[name] = None
        except Exception:  # noqa: BLE001  (reported to the parent)
            results[name] = traceback.format_exc()[-3000:]
    return results


@functools.cache  # one child a part, also where no background thread ran it (pytest-xdist workers)
def _results(part: str) -> dict:
    return background.child_json(_argv(part), interpret=False)


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.background_child(_argv(_part(name)),
                                                                                       interpret=False))
                                  for name in CHECK_NAMES])  # started in the background: tests/background.py
def test_compiles_for_sm90(name):
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    results = _results(_part(name))
    assert name in results, f"check {name} did not run"
    assert results[name] is None, results[name]


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("run without TRITON_INTERPRET: these checks compile for the GPU")
    sys.path.insert(0, str(REPO))
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="sm90-triton-")  # nothing from an earlier compile
    print(json.dumps(_child(sys.argv[2])))
