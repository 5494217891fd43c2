"""Microbenchmark of ``ce::fused_moe`` (ops/triton/moe_kernels.py) on the Qwen3.5-35B-A3B expert shape (GPU).

For T tokens (decode batches and prefill sizes) routed top-8 over 256 experts (H 2048, I 512, bf16): µs per call as
a captured CUDA graph (as the decode step runs it; align, both grouped GEMMs, the sum), the bytes it must read (the
distinct experts the routing touched, counted from the ids, plus x, the weights and the output) as a fraction of
the copy bandwidth measured in the same run, and the TFLOP/s of the expert GEMMs (2 x 3 x H x I per routed row).
With ``--sweep`` every tile config of ``CONFIGS`` is timed too, to tune ``moe_kernels.moe_config`` on the GPU.

``ce::routed_moe`` (what a sparse layer runs: the route, then the experts) is timed at ``--routed-tokens`` down both
of its paths, the GEMVs (``experts_gemv``) and the align and grouped GEMMs, with the same bytes counted; with
``--sweep`` at 1 token every ``GEMV_CONFIGS`` tile of the GEMVs too (one kernel's tiles varied, the other's at the
rule's).

    python bench/moe_microbench.py --out DIR [--sweep] [--tokens 1,8,64,256,2048,16384] [--routed-tokens 1,2,4,8]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton

import ops  # noqa: F401  (registers the ce ops)
from bench.ops_microbench import copy_bandwidth_gbps
from ops.moe import moe_route_op
from ops.triton import moe_kernels

EXPERTS, TOP_K, HIDDEN, INTER = 256, 8, 2048, 512
CONFIGS = [dict(block_m=m, block_n=n, block_k=k, num_warps=w)
           for m in (16, 32, 64) for n in (32, 64, 128) for k in (64, 128) for w in (4, 8)]
GEMV_CONFIGS = ([("gate_up", dict(block_n=n, block_k=k, num_warps=w)) for n in (2, 4, 8) for k in (512, 1024, 2048)
                 for w in (4, 8)]
                + [("down", dict(block_n=n, block_k=k, num_warps=w)) for n in (1, 2, 4, 8) for k in (128, 256, 512)
                   for w in (4, 8)])


def time_graph(fn) -> float:
    """Median µs of ``fn`` replayed as a CUDA graph (L2 flushed before each call by do_bench)."""
    fn()  # compile the Triton kernels before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, return_mode="median") * 1e3


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", default="1,8,64,256,2048,16384")
    p.add_argument("--routed-tokens", default="1,2,4,8")
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    g = torch.Generator(device="cuda").manual_seed(0)
    gate_up = (torch.randn(EXPERTS, 2 * INTER, HIDDEN, device="cuda", generator=g) * HIDDEN**-0.5).bfloat16()
    down = (torch.randn(EXPERTS, HIDDEN, INTER, device="cuda", generator=g) * INTER**-0.5).bfloat16()
    bandwidth = copy_bandwidth_gbps() * 1e9
    expert_bytes = 3 * HIDDEN * INTER * 2
    rows = []
    for tokens in [int(t) for t in args.tokens.split(",") if t]:
        x = torch.randn(tokens, HIDDEN, device="cuda", generator=g).bfloat16()
        weights, ids = moe_route_op(torch.randn(tokens, EXPERTS, device="cuda", generator=g), TOP_K, True)
        touched = int(torch.unique(ids).numel())
        nbytes = touched * expert_bytes + 2 * x.numel() * 2 + weights.numel() * 8
        flops = 2 * 3 * HIDDEN * INTER * tokens * TOP_K
        configs = [None] + (CONFIGS if args.sweep else [])
        for config in configs:
            kwargs = config or {}
            try:
                us = time_graph(lambda: moe_kernels.fused_moe(x, gate_up, down, weights, ids, **kwargs))
            except Exception as error:  # noqa: BLE001  (a config that does not fit: reported, not fatal)
                rows.append(dict(tokens=tokens, config=config, error=repr(error)[:300]))
                continue
            row = dict(tokens=tokens, config=config or moe_kernels.moe_config(tokens * TOP_K, EXPERTS),
                       rule=config is None, us=us, experts_touched=touched, bytes=nbytes,
                       bandwidth_fraction=nbytes / (us * 1e-6) / bandwidth, tflops=flops / (us * 1e-6) / 1e12)
            rows.append(row)
            print(json.dumps(row))
    for tokens in [int(t) for t in args.routed_tokens.split(",") if t]:
        rows += routed_rows(tokens, gate_up, down, bandwidth, g, args.sweep)
    result = {"shape": dict(experts=EXPERTS, top_k=TOP_K, hidden=HIDDEN, inter=INTER), "copy_GBps": bandwidth / 1e9,
              "rows": rows}
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "moe_microbench.json").write_text(json.dumps(result, indent=2))


def routed_rows(tokens, gate_up, down, bandwidth, g, sweep) -> list[dict]:
    """``ce::routed_moe`` at ``tokens`` tokens down each decode path (and the GEMV tiles with ``sweep`` at 1 token)."""
    x = torch.randn(tokens, HIDDEN, device="cuda", generator=g).bfloat16()
    logits = torch.randn(tokens, EXPERTS, device="cuda", generator=g)
    _, ids = moe_route_op(logits, TOP_K, True)
    touched = int(torch.unique(ids).numel())
    nbytes = touched * 3 * HIDDEN * INTER * 2 + 2 * x.numel() * 2 + logits.numel() * 4
    default = moe_kernels.moe_gemv_config(HIDDEN, INTER)
    variants = [("gemv", None), ("grouped", None)]
    if sweep and tokens == 1:
        variants += [("gemv", dict(default, **{kernel: tiles})) for kernel, tiles in GEMV_CONFIGS]
    grouped = moe_kernels.moe_config(tokens * TOP_K, EXPERTS)
    rows = []

    def call(path, config):  # what routed_moe runs: the route, then the path's experts
        weights, chosen = moe_kernels.moe_route(logits, TOP_K, True)
        if path == "grouped":  # tiles given: fused_moe runs the grouped GEMMs at any token count
            return moe_kernels.fused_moe(x, gate_up, down, weights, chosen, **grouped)
        return moe_kernels.experts_gemv(x, gate_up, down, weights, chosen, config or default)

    for path, config in variants:
        try:
            us = time_graph(lambda: call(path, config))
        except Exception as error:  # noqa: BLE001  (a tile that does not fit: reported, not fatal)
            rows.append(dict(op="routed_moe", tokens=tokens, path=path, config=config, error=repr(error)[:300]))
            continue
        row = dict(op="routed_moe", tokens=tokens, path=path,
                   config=config or (default if path == "gemv" else grouped), rule=config is None, us=us,
                   experts_touched=touched, bytes=nbytes, bandwidth_fraction=nbytes / (us * 1e-6) / bandwidth)
        rows.append(row)
        print(json.dumps(row))
    return rows


if __name__ == "__main__":
    main()
