"""Microbenchmark of every ``ce`` op's CUDA kernel on the Qwen3.5-0.8B shapes, against measured copy bandwidth.

For each op at batch 1, 64 and 256: µs per call and achieved bandwidth (bytes we count / time) as a fraction of
the device-to-device copy bandwidth measured in the same run (bytes read + written). Decode ops run as a
captured CUDA graph of one call (as they run in the engine); prefill ops run eagerly (FLA's chunked kernel syncs
with the host and the engine does not capture prefill). Every timing is the median of
``triton.testing.do_bench``, which flushes the L2 before each call, so batch-1 numbers are not L2 hits.

Bytes counted: every tensor the op must read or write once (states read + written, KV read at the context
length, activations in and out); the minimum traffic, so the fraction is a roofline fraction.

``gated_deltanet_verify``/``gated_deltanet_commit``: speculative decoding's verify kernel at P = 2, 3, 4 positions a
sequence (the pools read only; the launch ``VERIFY_LAUNCHES`` picks) and its commit (all P updates replayed), beside
``gated_deltanet_decode``; at P = 3 also each launch the rule chooses among (``vBLOCK`` rows: whole heads at v128,
else each head's columns in blocks over programs, the norm a second launch).

``linear``: ce::linear (our skinny GEMM up to ``SKINNY_MAX_ROWS`` rows, cuBLAS above) against ``F.linear`` (cuBLAS)
on each weight shape of the model at ``--linear-rows`` rows (default 1, 2, 8 and 64: the skinny GEMM's two, then
the cuBLAS fallback), both as captured CUDA graphs; bytes are the weight plus x and the output. The "linear step"
rows add up the 97 weight matmuls of one decode step (each shape times its count). With ``--sweep`` the skinny
GEMM's candidate configs are timed too at the rows it serves (GEMV_CONFIGS at one row, GEMV_ROWS_CANDIDATES above),
for choosing the configs on the GPU.

    python bench/ops_microbench.py --out results/          # table on stdout, JSON in results/ops_microbench.json
    python bench/ops_microbench.py --out results/ --sweep  # also sweep the decode kernels' tile sizes
    python bench/ops_microbench.py --out results/ --batches "" --sweep  # only the linear rows and their configs

``--state-dtype bfloat16``: the Gated DeltaNet rows on a bf16 state pool (``LLM(state_dtype=torch.bfloat16)``), its
bytes counted at 2 an element.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ops/ beside bench/, as with PYTHONPATH=.

import ops  # noqa: E402,F401  (registers torch.ops.ce)
from ops import layouts  # noqa: E402
from ops.linear import SKINNY_MAX_ROWS, linear  # noqa: E402
from ops.triton import delta_rule_kernels, gated_deltanet_kernels, gemv_kernels, paged_attention_kernels  # noqa: E402


@dataclass
class Shape:
    """Qwen3.5-0.8B (``linear_v_heads`` 32: two value heads a key head, as in Qwen3-Next's and Qwen3.5-35B's linear
    layers)."""

    hidden: int = 1024
    layers: int = 24
    linear_k_heads: int = 16
    linear_v_heads: int = 16
    key_dim: int = 128
    value_dim: int = 128
    conv_width: int = 4
    q_heads: int = 8
    kv_heads: int = 2
    head_dim: int = 256
    block_size: int = 16
    intermediate: int = 3584
    vocab: int = 248320
    full_attention_interval: int = 4  # every 4th layer is full attention, the others Gated DeltaNet

    @property
    def conv_dim(self) -> int:
        """The q, k, v channels (6,144 on Qwen3.5-0.8B)."""
        return 2 * self.linear_k_heads * self.key_dim + self.linear_v_heads * self.value_dim

    def weight_matmuls(self) -> dict[str, tuple[int, int, int]]:
        """name -> (N, K, count per decode step) of every weight matmul (bf16 [N, K], no bias)."""
        full = self.layers // self.full_attention_interval
        gdn = self.layers - full
        value_dim = self.linear_v_heads * self.value_dim
        q_dim = self.q_heads * self.head_dim
        return {
            # q, k, v (the conv channels), z, then b and a: one per value head each
            "gdn_in_proj": (self.conv_dim + value_dim + 2 * self.linear_v_heads, self.hidden, gdn),
            "gdn_out_proj": (self.hidden, value_dim, gdn),
            "mlp_gate_up": (2 * self.intermediate, self.hidden, self.layers),
            "mlp_down": (self.hidden, self.intermediate, self.layers),
            "attn_qkv": (2 * q_dim + 2 * self.kv_heads * self.head_dim, self.hidden, full),  # q doubled: query, gate
            "attn_o_proj": (self.hidden, q_dim, full),
            "lm_head": (self.vocab, self.hidden, 1),  # the tied embedding, read once
        }


@dataclass
class Row:
    op: str
    batch: int
    us: float
    bytes: int
    gbps: float
    frac_copy: float
    method: str
    note: str = ""
    extra: dict = field(default_factory=dict)


def bench_us(fn, graph: bool) -> float:
    import triton.testing

    fn()  # compile / autotune outside the timed region (and outside a capture)
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        call = g.replay
    else:
        call = fn
    return triton.testing.do_bench(call, warmup=10, rep=60, return_mode="median") * 1e3


def guarded(errors: list, what: str, fn, graph: bool, skip: frozenset = frozenset()):
    """bench_us, but a failure is recorded and printed instead of ending the whole run."""
    if what.split(" ")[0] in skip:
        return None
    try:
        return bench_us(fn, graph)
    except Exception as exc:  # noqa: BLE001 - report and keep measuring the other ops
        import traceback

        traceback.print_exc()
        errors.append(f"{what}: {type(exc).__name__}: {exc}")
        return None


def copy_bandwidth_gbps(nbytes: int = 1 << 30) -> float:
    import triton.testing

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=10, rep=100, return_mode="median")
    return 2 * nbytes / (ms * 1e-3) / 1e9


def rand(*shape, dtype=torch.bfloat16, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


def live_slots(batch: int) -> torch.Tensor:
    """Slots 1..batch in random order (slot 0 is the null slot)."""
    return (torch.randperm(batch, device="cuda") + 1).to(torch.int32)


def decode_attention_inputs(s: Shape, batch: int, context: int):
    blocks_per_seq = context // s.block_size
    num_blocks = batch * blocks_per_seq + 1
    k_cache = rand(num_blocks, s.block_size, s.kv_heads, s.head_dim)
    v_cache = rand(num_blocks, s.block_size, s.kv_heads, s.head_dim)
    tables = (torch.randperm(num_blocks - 1, device="cuda") + 1).to(torch.int32).view(batch, blocks_per_seq)
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    return rand(batch, s.q_heads, s.head_dim), k_cache, v_cache, tables, lens


def run(args) -> dict:
    s = Shape(linear_v_heads=args.linear_v_heads)
    torch.manual_seed(0)
    copy_gbps = copy_bandwidth_gbps()
    rows: list[Row] = []

    errors: list[str] = []

    def timed(what: str, fn, graph: bool):
        return guarded(errors, what, fn, graph, frozenset(args.skip))

    def add(op, batch, us, nbytes, method, note="", **extra):
        if us is None or op in args.skip:
            return
        gbps = nbytes / (us * 1e-6) / 1e9
        rows.append(Row(op, batch, round(us, 2), nbytes, round(gbps, 1), round(gbps / copy_gbps, 3), method, note,
                        extra))
        print(f"  {op:<28} B={batch:<4} {us:9.2f} us  {gbps:8.1f} GB/s  {gbps / copy_gbps:6.1%}  {note}", flush=True)

    bf16, ctx = 2, args.context
    for batch in args.batches:
        print(f"batch {batch}", flush=True)
        # --- store_kv: one new token per sequence into the paged cache
        k_cache = rand(batch * 4 + 1, s.block_size, s.kv_heads, s.head_dim)
        v_cache = torch.empty_like(k_cache)
        key, value = rand(batch, s.kv_heads, s.head_dim), rand(batch, s.kv_heads, s.head_dim)
        rows_kv = torch.randperm(batch * 4 * s.block_size, device="cuda")[:batch] + s.block_size
        us = timed(f"store_kv B={batch}",
                     lambda: torch.ops.ce.store_kv(key, value, k_cache, v_cache, rows_kv), graph=True)
        add("store_kv", batch, us, 2 * 2 * batch * s.kv_heads * s.head_dim * bf16, "graph")

        # --- paged attention decode at the given context
        q, kc, vc, tables, lens = decode_attention_inputs(s, batch, ctx)
        scale = s.head_dim**-0.5
        kv_bytes = 2 * batch * ctx * s.kv_heads * s.head_dim * bf16
        qo_bytes = 2 * batch * s.q_heads * s.head_dim * bf16
        splits = paged_attention_kernels.decode_num_splits(batch, s.kv_heads, tables.shape[1], s.block_size,
                                                           q.device)
        us = timed(f"paged_attention_decode B={batch}",
                     lambda: torch.ops.ce.paged_attention_decode(q, kc, vc, tables, lens, scale), graph=True)
        add("paged_attention_decode", batch, us, kv_bytes + qo_bytes, "graph", f"ctx {ctx}, {splits} splits",
            splits=splits)
        # the query tile padded to the mma's 16 rows, as before the tile took the GQA group's power of two
        us = timed(f"paged_attention_decode query_rows=16 B={batch}",
                   lambda: paged_attention_kernels.paged_attention_decode(q, kc, vc, tables, lens, scale,
                                                                          query_rows=16), graph=True)
        add("  paged_attention_decode 16 rows", batch, us, kv_bytes + qo_bytes, "graph",
            f"ctx {ctx}, {splits} splits, query tile of 16 rows")
        if args.sweep and batch in (min(args.batches), max(args.batches)):
            for block_n in (16, 32, 64):
                for warps in (4, 8):
                    for sp in sorted({max(1, splits // 2), splits, splits * 2}):
                        us = timed(f"sweep paged_decode B={batch}",
                                     lambda: paged_attention_kernels.paged_attention_decode(
                                         q, kc, vc, tables, lens, scale, num_splits=sp, block_n=block_n,
                                         num_warps=warps),
                                     graph=True)
                        add("  sweep paged_decode", batch, us, kv_bytes + qo_bytes, "graph",
                            f"block_n {block_n} warps {warps} splits {sp}", block_n=block_n, num_warps=warps,
                            splits=sp)
        del q, kc, vc, tables, lens

        # --- paged attention prefill: `batch` sequences of args.prefill_len new tokens, no cached prefix
        n_new = args.prefill_len
        blocks_per_seq = n_new // s.block_size
        kc = rand(batch * blocks_per_seq + 1, s.block_size, s.kv_heads, s.head_dim)
        vc = rand(batch * blocks_per_seq + 1, s.block_size, s.kv_heads, s.head_dim)
        tables = (torch.arange(batch * blocks_per_seq, device="cuda", dtype=torch.int32) + 1).view(batch, -1)
        cu = torch.arange(0, (batch + 1) * n_new, n_new, dtype=torch.int32, device="cuda")
        lens = torch.full((batch,), n_new, dtype=torch.int32, device="cuda")
        q = rand(batch * n_new, s.q_heads, s.head_dim)
        us = timed(f"paged_attention_prefill B={batch}",
                     lambda: torch.ops.ce.paged_attention_prefill(q, kc, vc, cu, lens, tables, scale), graph=False)
        flops = 4 * s.q_heads * s.head_dim * batch * n_new * (n_new + 1) / 2
        nbytes = 2 * batch * n_new * (s.kv_heads + s.q_heads) * s.head_dim * bf16
        if us is not None:
            add("paged_attention_prefill", batch, us, nbytes, "eager",
                f"{n_new} tok/seq, {flops / us / 1e6:.1f} TFLOP/s", tflops=flops / us / 1e6)
        del kc, vc, q

        # --- conv1d decode / prefill
        weight = rand(s.conv_dim, s.conv_width, scale=0.5)
        conv_state = rand(batch + 1, s.conv_dim, s.conv_width - 1)
        slots = live_slots(batch)
        x = rand(batch, s.conv_dim)
        us = timed(f"causal_conv1d_decode B={batch}",
                     lambda: torch.ops.ce.causal_conv1d_decode(x, weight, conv_state, slots), graph=True)
        state_bytes = batch * s.conv_dim * (s.conv_width - 1) * bf16
        add("causal_conv1d_decode", batch, us, 2 * state_bytes + 2 * batch * s.conv_dim * bf16, "graph")
        xp = rand(batch * n_new, s.conv_dim)
        us = timed(f"causal_conv1d_prefill B={batch}",
                     lambda: torch.ops.ce.causal_conv1d_prefill(xp, weight, conv_state, cu, slots, [xp.shape[1], 0, 0]),
                     graph=False)
        add("causal_conv1d_prefill", batch, us, 2 * state_bytes + 2 * xp.numel() * bf16, "eager",
            f"{n_new} tok/seq")
        del xp

        # --- gated delta rule decode: the in-place state update (the batch-256 target)
        hk, hv, dk, dv = s.linear_k_heads, s.linear_v_heads, s.key_dim, s.value_dim
        state_dtype = getattr(torch, args.state_dtype)
        state = rand(batch + 1, hv, dk, dv, dtype=state_dtype, scale=0.1)
        A_log, dt_bias = rand(hv, dtype=torch.float32, scale=0.5), rand(hv, dtype=torch.float32)
        lq, lk = rand(batch, hk, dk), rand(batch, hk, dk)
        lv, la, lb = rand(batch, hv, dv), rand(batch, hv), rand(batch, hv)
        rec_bytes = 2 * batch * hv * dk * dv * state.element_size()
        act_bytes = (2 * batch * hk * dk + 2 * batch * hv * dv + 2 * batch * hv) * bf16
        us = timed(f"gated_delta_rule_decode B={batch}",
                     lambda: torch.ops.ce.gated_delta_rule_decode(lq, lk, lv, la, lb, A_log, dt_bias, state, slots),
                     graph=True)
        add("gated_delta_rule_decode", batch, us, rec_bytes + act_bytes, "graph", f"{args.state_dtype} state, in place")
        if args.sweep and batch == max(args.batches):
            for block_v in (8, 16, 32, 64, 128):
                for warps in (1, 2, 4, 8):
                    us = timed(f"sweep gdr_decode B={batch}",
                                 lambda: delta_rule_kernels.gated_delta_rule_decode(
                                     lq, lk, lv, la, lb, A_log, dt_bias, state, slots, block_v=block_v,
                                     num_warps=warps),
                                 graph=True)
                    add("  sweep gdr_decode", batch, us, rec_bytes + act_bytes, "graph",
                        f"block_v {block_v} warps {warps}", block_v=block_v, num_warps=warps)
        # --- the whole Gated DeltaNet decode between in_proj and out_proj: the fused kernel against its pieces
        value_width = hv * dv
        projected = rand(batch, s.conv_dim + value_width + 2 * hv)
        norm_weight = rand(dv)
        fused_bytes = rec_bytes + 2 * state_bytes + (projected.numel() + batch * value_width) * bf16
        # the fused kernel with whole heads (8 warps), the unfused kernels, the fused kernel in V tiles of 64 (8 warps)
        # and 32 (4 warps: at 4 warps, tiles of 64 spill), the tiles also with their loads in walk order (no prefetch),
        # and so whole heads where a program walks more than one (G > 1)
        # and the tiles of 16, 32 and 64 over programs (split: the last program of a key head writes its q/k history and
        # norms)
        variants = [(True, 8, None, True), (False, 8, None, True), (True, 8, 64, True), (True, 8, 64, False),
                    (True, 4, 32, True), (True, 4, 32, False)] + ([(True, 8, None, False)] if hv > hk else [])
        variants = [v + (False,) for v in variants] + [(True, 2, 16, False, True), (True, 4, 32, False, True),
                                                        (True, 8, 64, False, True)]
        sweep = [(True, 4, None, True, False), (True, 16, None, True, False)] if args.sweep else []
        for fused, warps, block_v, prefetch, split_v in variants + sweep:
            us = timed(f"gated_deltanet_decode fused={fused} warps={warps} block_v={block_v} prefetch={prefetch} "
                       f"split_v={split_v} B={batch}",
                       lambda: gated_deltanet_kernels.gated_deltanet_decode(
                           projected, weight, conv_state, A_log, dt_bias, norm_weight, state, slots, hk, dk, hv, dv,
                           1e-6, num_warps=warps, fused=fused, block_v=block_v, prefetch=prefetch, split_v=split_v),
                       graph=True)
            if not fused:
                op, note = "  unfused conv+delta+norm", "3 kernels"
            elif split_v:
                op = f"  gated_deltanet_decode v{block_v} split"
                note = f"V tiles of {block_v} over programs, {warps} warps"
            elif block_v is not None:
                op = f"  gated_deltanet_decode v{block_v}" + ("" if prefetch else " in order")
                note = f"one kernel, V tiles of {block_v}, {warps} warps" + ("" if prefetch else ", no prefetch")
            elif not prefetch:
                op, note = "  gated_deltanet_decode in order", f"one kernel, {warps} warps, no prefetch"
            else:
                op = "gated_deltanet_decode" if warps == 8 else "  sweep gated_deltanet_decode"
                note = f"one kernel, {warps} warps"
            add(op, batch, us, fused_bytes, "graph", note, num_warps=warps, block_v=block_v, prefetch=prefetch,
                split_v=split_v)
        # --- speculative decoding's verify step (P = k + 1 positions a sequence) and its commit (all accepted)
        history_width = layouts.gated_deltanet_history_offsets(hk, dk, hv, dv)[3]
        for positions in (2, 3, 4):
            rows_p = torch.cat([projected] * positions)  # any values: the cost does not depend on them
            history = torch.zeros(batch, positions, history_width, device="cuda")
            accepted = torch.full((batch,), positions - 1, dtype=torch.long, device="cuda")
            history_bytes = history.numel() * 4
            verify_bytes = rec_bytes // 2 + state_bytes + (rows_p.numel() + batch * positions * value_width) * bf16
            commit_bytes = rec_bytes + 2 * state_bytes + history_bytes
            us = timed(f"gated_deltanet_verify P={positions} B={batch}",
                       lambda: gated_deltanet_kernels.gated_deltanet_verify(
                           rows_p, weight, conv_state, A_log, dt_bias, norm_weight, state, slots, history, hk, dk,
                           hv, dv, 1e-6),
                       graph=True)
            add(f"gated_deltanet_verify P={positions}", batch, us, verify_bytes + history_bytes, "graph",
                "pools read only")
            if positions == 3:  # whole heads, and each head's columns over programs (the norm a second launch, or
                # by each key head's last program: split)
                for block_v, warps, split in ((dv, 8, False), (64, 4, False), (32, 4, False), (16, 2, False),
                                              (64, 4, True), (32, 4, True), (16, 2, True)):
                    us = timed(f"gated_deltanet_verify P=3 v{block_v} split={split} B={batch}",
                               lambda: gated_deltanet_kernels.gated_deltanet_verify(
                                   rows_p, weight, conv_state, A_log, dt_bias, norm_weight, state, slots, history, hk,
                                   dk, hv, dv, 1e-6, num_warps=warps, block_v=block_v, split_norm=split),
                               graph=True)
                    note = (f"whole heads, {warps} warps, the norm in the kernel" if block_v == dv
                            else f"V blocks of {block_v} over programs, {warps} warps, "
                                 + ("the norm by each key head's last program" if split else "+ the norm kernel"))
                    add(f"  gated_deltanet_verify P=3 v{block_v}{' split' if split else ''}", batch, us,
                        verify_bytes + history_bytes, "graph", note, num_warps=warps, block_v=block_v,
                        split_norm=split)
            us = timed(f"gated_deltanet_commit P={positions} B={batch}",
                       lambda: gated_deltanet_kernels.gated_deltanet_commit(
                           [conv_state], [state], slots, [history], accepted, hk, dk, hv, dv),
                       graph=True)
            add(f"gated_deltanet_commit P={positions}", batch, us, commit_bytes, "graph",
                f"{positions} updates replayed, one layer (the engine commits all 18 in one launch)")
            del rows_p, history
        del projected
        if args.baseline:
            try:
                from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
            except ImportError:
                fused_recurrent_gated_delta_rule = None
            if fused_recurrent_gated_delta_rule is not None:
                def fla_gather_scatter():
                    g = -A_log.exp() * torch.nn.functional.softplus(la.float() + dt_bias)
                    o, final = fused_recurrent_gated_delta_rule(
                        lq[:, None], lk[:, None], lv[:, None], g=g[:, None], beta=lb.float().sigmoid()[:, None],
                        initial_state=state[slots.long()], output_final_state=True, use_qk_l2norm_in_kernel=True)
                    state.index_copy_(0, slots.long(), final)
                    return o

                us = timed(f"FLA baseline B={batch}", fla_gather_scatter, graph=True)
                add("  baseline FLA gather+scatter", batch, us, rec_bytes + act_bytes, "graph",
                    "fused_recurrent + gather/scatter")

        # --- gated delta rule prefill (FLA chunked): `batch` sequences of n_new tokens
        t = batch * n_new
        pq, pk = rand(t, hk, dk), rand(t, hk, dk)
        pv, pa, pb = rand(t, hv, dv), rand(t, hv), rand(t, hv)
        us = timed(f"gated_delta_rule_prefill B={batch}",
                     lambda: torch.ops.ce.gated_delta_rule_prefill(pq, pk, pv, pa, pb, A_log, dt_bias, state, cu,
                                                                   slots), graph=False)
        nbytes = rec_bytes + (2 * t * hk * dk + 2 * t * hv * dv) * bf16
        if us is not None:
            add("gated_delta_rule_prefill", batch, us, nbytes, "eager",
                f"{n_new} tok/seq, {t / us:.2f} Mtok/s", mtok_per_s=t / us)
        del state, pq, pk, pv

    if "linear" not in args.skip:
        bench_linear(s, args, timed, add)

    return {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "shape": asdict(s),
        "context": ctx,
        "prefill_len": args.prefill_len,
        "copy_bandwidth_gbps": round(copy_gbps, 1),
        "rows": [asdict(r) for r in rows],
        "errors": errors,
    }


# The few-rows GEMV's candidates at 2..GEMV_MAX_ROWS rows (BLOCK_N, BLOCK_K, num_warps, num_stages), BLOCK_M from
# the row count: BLOCK_K = 256 x num_warps (see gemv_kernels). Swept here (--sweep) and by bench/gemv_sweep.py.
GEMV_ROWS_CANDIDATES = [(2, 2048, 8, 1), (4, 2048, 8, 1), (8, 2048, 8, 1), (2, 1024, 4, 1), (4, 1024, 4, 1),
                        (8, 1024, 4, 1)]


def gemv_rows_candidates(rows: int) -> list:
    """GEMV_ROWS_CANDIDATES as configs at ``rows`` rows (BLOCK_M: the rows rounded up to a power of two)."""
    block_m = max(2, triton.next_power_of_2(rows))
    return [gemv_kernels._config(*c, block_m=block_m) for c in GEMV_ROWS_CANDIDATES]


def _config_note(config) -> str:
    k = config.kwargs
    block_m = f"BLOCK_M {k['BLOCK_M']} " if "BLOCK_M" in k else ""
    return (f"{block_m}BLOCK_N {k['BLOCK_N']} BLOCK_K {k['BLOCK_K']} warps {config.num_warps} "
            f"stages {config.num_stages}")


def bench_linear(s: Shape, args, timed, add) -> None:
    """ce::linear against F.linear (cuBLAS) per weight shape and row count, and summed over one decode step."""
    shapes = s.weight_matmuls()
    print("linear", flush=True)
    for rows in args.linear_rows:
        step = {"ce": [0.0, 0], "cuBLAS": [0.0, 0]}  # summed µs and bytes over the step's matmuls
        for name, (n, k, count) in shapes.items():
            x, weight = rand(rows, k), rand(n, k, scale=k**-0.5)
            nbytes = 2 * (n * k + rows * k + rows * n)
            us = timed(f"linear {name} M={rows}", lambda: linear(x, weight), graph=True)
            if rows <= SKINNY_MAX_ROWS:
                picked = gemv_kernels.skinny_config(rows, n, k)
                note = f"[{n}, {k}] skinny GEMM, {_config_note(picked)}"
            else:
                note = f"[{n}, {k}] cuBLAS (above {SKINNY_MAX_ROWS} rows)"
            base = timed(f"linear cuBLAS {name} M={rows}", lambda: torch.nn.functional.linear(x, weight), graph=True)
            if us is not None and base is not None:
                note += f", {base / us:.2f}x cuBLAS"
            add(f"linear {name}", rows, us, nbytes, "graph", note, n=n, k=k)
            add(f"  baseline cuBLAS {name}", rows, base, nbytes, "graph", f"[{n}, {k}] F.linear", n=n, k=k)
            for what, t in (("ce", us), ("cuBLAS", base)):
                if step[what] is not None and t is not None:
                    step[what][0] += count * t
                    step[what][1] += count * nbytes
                else:
                    step[what] = None  # a failed shape: no step total
            if args.sweep and rows <= SKINNY_MAX_ROWS:
                # one row: GEMV_CONFIGS (the rule's and a few more); more: the few-rows GEMV's candidates
                configs = gemv_kernels.GEMV_CONFIGS if rows == 1 else gemv_rows_candidates(rows)
                for config in configs:
                    block_m = config.kwargs.get("BLOCK_M", 1)
                    t = timed(f"sweep linear {name} M={rows}",
                              lambda: gemv_kernels.skinny_gemm(x, weight, config), graph=True)
                    add(f"  sweep linear {name}", rows, t, nbytes, "graph", f"BLOCK_M {block_m} {_config_note(config)}",
                        block_m=block_m, **config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)
            del x, weight
        for what, total in step.items():
            if total is not None:
                op = "linear step" if what == "ce" else "  baseline cuBLAS step"
                add(op, rows, total[0], total[1], "graph", f"{sum(c for _, _, c in shapes.values())} matmuls, "
                    f"sum of per-shape graphs")


def print_table(result: dict) -> None:
    print(f"\n{result['device']}: copy bandwidth {result['copy_bandwidth_gbps']:.0f} GB/s (read + write)")
    print(f"| {'op':<30} | {'batch':>5} | {'µs':>9} | {'GB/s':>8} | {'% copy':>6} | notes")
    print(f"|{'-' * 32}|{'-' * 7}|{'-' * 11}|{'-' * 10}|{'-' * 8}|------")
    for r in result["rows"]:
        if r["op"].startswith("  sweep"):
            continue
        print(f"| {r['op']:<30} | {r['batch']:>5} | {r['us']:>9.2f} | {r['gbps']:>8.1f} | {r['frac_copy']:>6.1%} | "
              f"{r['method']}; {r['note']}")
    best = {}
    for r in result["rows"]:
        if r["op"].startswith("  sweep"):
            key = (r["op"].strip(), r["batch"])
            if key not in best or r["us"] < best[key]["us"]:
                best[key] = r
    for (op, batch), r in sorted(best.items()):
        print(f"best {op} at batch {batch}: {r['us']:.2f} µs ({r['frac_copy']:.1%} of copy) with {r['note']}")
    for error in result["errors"]:
        print(f"ERROR {error}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for ops_microbench.json")
    parser.add_argument("--batches", type=lambda s: [int(b) for b in s.split(",") if b], default=[1, 64, 256],
                        help="batch sizes of the per-op rows (empty: none, e.g. for the linear rows alone)")
    parser.add_argument("--context", type=int, default=1024, help="decode attention context length")
    parser.add_argument("--prefill-len", type=int, default=128, help="new tokens per sequence in prefill rows")
    parser.add_argument("--linear-rows", type=lambda s: [int(b) for b in s.split(",")], default=[1, 2, 8, 64],
                        help="rows of x (batch) for the linear rows")
    parser.add_argument("--linear-v-heads", type=int, default=16,
                        help="value heads of the linear layers (16 key heads): 32 times the G = 2 kernels of "
                             "Qwen3-Next / Qwen3.5-35B (the rest of the shape stays 0.8B's)")
    parser.add_argument("--state-dtype", default="float32", choices=["float32", "bfloat16"],
                        help="the recurrent state pool's dtype in the Gated DeltaNet rows (LLM's state_dtype)")
    parser.add_argument("--sweep", action="store_true", help="also sweep decode tile sizes and skinny GEMM configs")
    parser.add_argument("--skip", type=lambda s: set(s.split(",")), default=set(),
                        help="comma-separated ops to leave out (e.g. gated_delta_rule_prefill: FLA autotunes; "
                             "linear: every weight shape, tuned at start)")
    parser.add_argument("--no-baseline", dest="baseline", action="store_false",
                        help="skip the FLA fused_recurrent + gather/scatter baseline row")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("ops_microbench needs a CUDA device")
    start = time.time()
    result = run(args)
    result["wall_s"] = round(time.time() - start, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ops_microbench.json").write_text(json.dumps(result, indent=1))
    print_table(result)


if __name__ == "__main__":
    main()
