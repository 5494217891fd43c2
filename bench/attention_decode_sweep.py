"""Decode attention configs timed at mid-batch, long-context shapes: data for ``ce::attention_decode``'s split count,
key tile, warps and pipeline stages.

``ce::attention_decode`` (q/k norm, RoPE, the KV store and the paged attention of one decode token, the decode
graph's attention op) on the Qwen3.5-0.8B attention shape (8 query heads, 2 KV heads, head_dim 256, partial RoPE
64, block_size 16, bf16), each sequence's blocks scattered over the pool as a running engine leaves them. Per case
(batch x context) every candidate (splits, BLOCK_N, warps, stages) is checked against the default config's output,
then timed as 20 calls in one CUDA graph (median of the replays; the reduce kernel included). The bound is the K/V
bytes the call reads at the copy bandwidth measured in the same process. ``--early-loads`` times only the default
config, with the step's inputs and first key tile read before the PDL wait and without (in this chain the kernel
before each call is the previous call's reduce kernel, not qkv_proj); ``--query-rows``, the default config with the
query tile padded to 16 rows (the mma's M) and at the GQA group's power of two (the default); ``--splits 16,32,64``,
the default config at each of those split counts; ``--reduce-parts 1,8``, at each of those reduce kernel programs a
query head (with ``--splits``: every pair); ``--warps 4,8 --stages 1,2,3``, the default split count and key tile at
each pair.

    python bench/attention_decode_sweep.py --out DIR [--cases 1x8192,16x8192,64x8192] [--early-loads]

``--ncu``: no timing; each case's default config (both orders of loads with ``--early-loads``) runs once between
``cudaProfilerStart`` and ``cudaProfilerStop``, for Nsight Compute (its command as in bench/gemv_ncu.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ops/ beside bench/, as with PYTHONPATH=.

from bench.attention_prefill_sweep import time_ms  # noqa: E402
from bench.ops_microbench import copy_bandwidth_gbps  # noqa: E402
from ops.triton.attention_decode_kernels import EARLY_LOADS_MAX_BATCH, attention_decode, decode_stages  # noqa: E402
from ops.triton.paged_attention_kernels import _tile_n, decode_num_splits  # noqa: E402

HQ, HKV, D, BLOCK, ROTARY_HALF = 8, 2, 256, 16, 32
CALLS = 20  # calls a graph replay


def _case(batch: int, context: int, width: int | None = None):
    """``width``: the block tables' width in tokens (an engine's max_model_len; default: the context), which sets the
    default split count."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    blocks = -(-context // BLOCK)
    num_blocks = batch * blocks + 1
    k_cache = torch.randn(num_blocks, BLOCK, HKV, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v_cache = torch.randn(num_blocks, BLOCK, HKV, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    tables = (torch.randperm(num_blocks - 1, device="cuda", generator=gen) + 1).to(torch.int32).view(batch, blocks)
    if width is not None and -(-width // BLOCK) > blocks:
        tables = torch.nn.functional.pad(tables, (0, -(-width // BLOCK) - blocks))  # the null block past the context
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    positions = (lens - 1).long()
    slots = tables[:, (context - 1) // BLOCK].long() * BLOCK + (context - 1) % BLOCK
    projected = torch.randn(batch, HQ * 2 * D + 2 * HKV * D, device="cuda", dtype=torch.bfloat16, generator=gen)
    weights = torch.randn(2, D, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.1
    inv_freq = 1.0 / (1e7 ** (torch.arange(0, 2 * ROTARY_HALF, 2, device="cuda", dtype=torch.float32)
                              / (2 * ROTARY_HALF)))
    return (projected, weights[0], weights[1], 1e-6, inv_freq, positions, k_cache, v_cache, slots, tables, lens,
            HQ, HKV, D, D ** -0.5)


def graph_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    return time_ms(graph.replay, repeats=15) * 1e3 / CALLS  # the median replay, µs a call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", default="16x8192,64x8192,8x8192,1x8192",
                        help="BATCHxCONTEXT[xWIDTH], WIDTH the tables' width in tokens (default: the context)")
    parser.add_argument("--early-loads", action="store_true",
                        help="time only the default config, with and without the kernel's EARLY_LOADS")
    parser.add_argument("--query-rows", action="store_true",
                        help="time only the default config, with the query tile padded to 16 rows and without")
    parser.add_argument("--splits", type=lambda s: [int(x) for x in s.split(",")], default=None,
                        help="time only the default config at each of these split counts (the default's too)")
    parser.add_argument("--reduce-parts", type=lambda s: [int(x) for x in s.split(",")], default=None,
                        help="time the default config with the reduce kernel's channels over each of these numbers of "
                             "programs a query head")
    parser.add_argument("--stages", type=lambda s: [int(x) for x in s.split(",")], default=None,
                        help="time only the default split count and key tile at each of these pipeline stages (with "
                             "--warps: every pair; the rule's stages too)")
    parser.add_argument("--warps", type=lambda s: [int(x) for x in s.split(",")], default=None,
                        help="time only the default split count and key tile at each of these warps (see --stages)")
    parser.add_argument("--default-only", action="store_true",
                        help="time only the default config (A/B of a kernel edit)")
    parser.add_argument("--ncu", action="store_true", help="profile one call of each case's default config instead")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.ncu:
        return _profile(args)
    gbps = copy_bandwidth_gbps()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {gbps:.0f} GB/s", flush=True)
    results = []
    for case in args.cases.split(","):
        batch, context, *width = (int(x) for x in case.split("x"))
        inputs = _case(batch, context, *width)
        bound_us = batch * context * HKV * D * 2 * 2 / (gbps * 1e3)
        splits = decode_num_splits(batch, HKV, inputs[9].shape[1], BLOCK, torch.device("cuda"))
        chosen = (splits, _tile_n(D, 2), 4, decode_stages(batch))
        ref = attention_decode(*inputs).float()
        split_counts = sorted({max(1, splits // 2), splits, min(64, 2 * splits), min(64, 4 * splits)})
        grid = [chosen + (None, None)] + [c + (None, None) for c in itertools.product(split_counts, (32, 64), (4, 8),
                                                                                      (1, 2, 3)) if c != chosen]
        if args.early_loads:
            grid = [chosen + (False, None), chosen + (True, None)]
        if args.query_rows:
            grid = [chosen + (None, 16), chosen + (None, None)]
        if args.splits or args.reduce_parts:
            grid = [chosen + (None, None, None)] + [
                (n,) + chosen[1:] + (None, None, parts) for n in args.splits or [splits]
                for parts in args.reduce_parts or [None] if (n, parts) != (splits, None)]
        if args.stages or args.warps:
            grid = [chosen + (None, None)] + [
                chosen[:2] + (warps, stages, None, None) for warps in args.warps or [chosen[2]]
                for stages in args.stages or [None] if (warps, stages) != chosen[2:]]
        if args.default_only:
            grid = [chosen + (None, None)]
        for num_splits, block_n, warps, stages, early, rows, *parts in grid:
            parts = parts[0] if parts else None
            config = {"splits": num_splits, "block_n": block_n, "num_warps": warps, "num_stages": stages,
                      "early_loads": early, "query_rows": rows, "reduce_parts": parts,
                      "chosen": (num_splits, block_n, warps, stages) == chosen
                      and early in (None, batch <= EARLY_LOADS_MAX_BATCH) and rows is None and parts is None}
            # reduce_parts only where asked for, so that the script also times a tree from before the option
            extra = {} if parts is None else {"reduce_parts": parts}
            try:
                call = lambda: attention_decode(*inputs, num_splits=num_splits, block_n=block_n,  # noqa: E731
                                                num_warps=warps, num_stages=stages, early_loads=early,
                                                query_rows=rows, **extra)
                err = (call().float() - ref).abs().max().item()
                us = graph_us(call)
            except Exception as exc:  # out of shared memory and the like: not a candidate
                print(f"{case} {config}: {type(exc).__name__}: {str(exc)[:100]}", flush=True)
                continue
            results.append({"case": case, "config": config, "us": us, "frac_bound": bound_us / us,
                            "max_abs_diff": err})
            print(f"{case} {config}: {us:.1f} µs ({bound_us / us:.1%} of {bound_us:.1f}), |diff| {err:.1e}",
                  flush=True)
        mine = sorted((r for r in results if r["case"] == case), key=lambda r: r["us"])
        default = next(r for r in mine if r["config"]["chosen"])
        print(f"{case} default {default['us']:.1f} µs ({default['frac_bound']:.1%}); best:",
              *(f"  {r['us']:.1f} µs ({r['frac_bound']:.1%}) {r['config']}" for r in mine[:6]), sep="\n", flush=True)
        (args.out / "attention_decode_sweep.json").write_text(json.dumps(
            {"copy_bandwidth_gbps": gbps, "results": results}, indent=1))


def _profile(args) -> None:
    for case in args.cases.split(","):
        batch, context, *width = (int(x) for x in case.split("x"))
        inputs = _case(batch, context, *width)
        for early in ((False, True) if args.early_loads else (None,)):
            attention_decode(*inputs, early_loads=early)  # compile outside the profiled range
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            attention_decode(*inputs, early_loads=early)
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            print(f"profiled {case}, early_loads={early}", flush=True)


if __name__ == "__main__":
    main()
