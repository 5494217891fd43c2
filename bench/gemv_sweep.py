"""Skinny GEMM configs timed back to back, as a decode step runs them: data for choosing gemv_kernels' configs.

A batch-1 decode step runs 97 weight matmuls of 4-508 MB one after another in one CUDA graph. A 4 MB matmul takes
~1 µs at the H200's bandwidth, so launch, ramp-up and tail set its time; timed alone (one call per graph replay,
the L2 flushed before it, as ``triton.autotune`` and ``ops_microbench`` time it) it also pays the graph launch. Here
each (shape, config) is one CUDA graph of ``calls`` matmuls on distinct weight copies (together over 128 MB, so
every call reads DRAM, not the 50 MB L2), timed per matmul. Then the whole step: the 97 matmuls in model order in
one graph, through ``ce::linear`` (its configs), through cuBLAS, and with each shape's best swept config.

    python bench/gemv_sweep.py --out DIR [--rows 1,2]     # JSON in DIR/gemv_sweep.json, table on stdout

At 1..GEMV_MAX_ROWS rows the candidates are the GEMV's (the one-row loop at one row, the few-rows loop above);
``ce::linear`` rows record what the op runs (cuBLAS past SKINNY_MAX_ROWS, ops/linear.py).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ops/ beside bench/, as with PYTHONPATH=.

from bench.ops_microbench import Shape, copy_bandwidth_gbps, gemv_rows_candidates, rand  # noqa: E402
from ops.linear import SKINNY_MAX_ROWS, linear  # noqa: E402
from ops.triton import gemv_kernels  # noqa: E402
from ops.triton.gemv_kernels import _config  # noqa: E402

WORKING_SET_BYTES = 128 << 20  # weight copies per shape: together over the L2 (50 MB on an H200)
MIN_CALLS = 8

# Candidates (BLOCK_N, BLOCK_K, num_warps, num_stages), beyond the rule's configs themselves.
GEMV_CANDIDATES = [  # the one-row GEMV, BLOCK_M = 1
    (2, 1024, 4, 2), (2, 2048, 8, 1),
    (4, 256, 4, 4), (4, 512, 4, 3), (4, 1024, 4, 2), (4, 1024, 8, 2),
    (8, 128, 4, 4), (8, 256, 4, 4), (8, 512, 4, 3), (8, 512, 8, 3), (8, 1024, 8, 2),
    (16, 128, 4, 4), (16, 256, 4, 3), (16, 256, 8, 3), (16, 512, 8, 2),
    (32, 128, 4, 4), (32, 256, 8, 3), (64, 64, 4, 4), (64, 128, 8, 3),
]
# The few-rows GEMV's candidates at 2..GEMV_MAX_ROWS rows: ops_microbench.GEMV_ROWS_CANDIDATES.


def candidates_for(rows: int) -> list:
    """Every candidate config at ``rows`` rows, each with its BLOCK_M."""
    if rows == 1:
        return [_config(*c, block_m=1) for c in GEMV_CANDIDATES]
    return gemv_rows_candidates(rows)


def describe(c) -> str:
    kw = c.kwargs
    return f"BLOCK_M {kw['BLOCK_M']} N {kw['BLOCK_N']} K {kw['BLOCK_K']} w {c.num_warps} s {c.num_stages}"


def graph_us_per_call(calls: list) -> float:
    """Median µs per call of one CUDA graph that runs ``calls`` in order (each warmed up first)."""
    import triton.testing

    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    ms = triton.testing.do_bench(graph.replay, warmup=10, rep=50, return_mode="median")
    del graph
    return ms * 1e3 / len(calls)


def weight_copies(n: int, k: int) -> list[torch.Tensor]:
    copies = max(1, math.ceil(WORKING_SET_BYTES / (2 * n * k)))
    return [rand(n, k, scale=k**-0.5) for _ in range(copies)]


def step_order(s: Shape) -> list[str]:
    """The weight matmuls of one decode step, in model order."""
    names = []
    for layer in range(s.layers):
        full = (layer + 1) % s.full_attention_interval == 0
        names += ["attn_qkv", "attn_o_proj"] if full else ["gdn_in_proj", "gdn_out_proj"]
        names += ["mlp_gate_up", "mlp_down"]
    return names + ["lm_head"]


def sweep(rows: int, copy_gbps: float, out_rows: list) -> dict[str, tuple]:
    """Time every candidate on every shape at ``rows`` rows; returns shape -> (best µs, config)."""
    s = Shape()
    candidates = candidates_for(rows)
    best = {}
    for name, (n, k, _count) in s.weight_matmuls().items():
        x = rand(rows, k)
        weights = weight_copies(n, k)
        calls = max(MIN_CALLS, len(weights))
        nbytes = 2 * (n * k + rows * k + rows * n)

        def record(label, us, **extra):
            gbps = nbytes / (us * 1e-6) / 1e9
            out_rows.append({"rows": rows, "shape": name, "n": n, "k": k, "what": label, "us": round(us, 3),
                             "gbps": round(gbps, 1), "frac_copy": round(gbps / copy_gbps, 4), **extra})
            print(f"M={rows} {name:<13} [{n:>6}, {k:>4}] {label:<44} {us:8.2f} µs {gbps / copy_gbps:6.1%}",
                  flush=True)

        record("ce::linear (its pick)",
               graph_us_per_call([lambda w=weights[i % len(weights)]: linear(x, w) for i in range(calls)]),
               config=str(gemv_kernels.skinny_config(rows, n, k)) if rows <= SKINNY_MAX_ROWS else "cuBLAS")
        record("cuBLAS", graph_us_per_call(
            [lambda w=weights[i % len(weights)]: torch.nn.functional.linear(x, w) for i in range(calls)]))
        for config in candidates:
            try:
                us = graph_us_per_call([lambda w=weights[i % len(weights)]: gemv_kernels.skinny_gemm(x, w, config)
                                        for i in range(calls)])
            except Exception as exc:  # noqa: BLE001 - a config that does not compile or fit: note it, go on
                print(f"M={rows} {name} {describe(config)}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            record(describe(config), us, config=describe(config))
            if name not in best or us < best[name][0]:
                best[name] = (us, config)
        del weights, x
        torch.cuda.empty_cache()
    return best


def whole_step(rows: int, best: dict, copy_gbps: float) -> dict:
    """One graph of the step's 97 matmuls in model order: ce::linear, cuBLAS, and each shape's best swept config."""
    s = Shape()
    shapes = s.weight_matmuls()
    order = step_order(s)
    xs = {k: rand(rows, k) for k in {kk for _, kk, _ in shapes.values()}}
    weights = [rand(shapes[name][0], shapes[name][1], scale=shapes[name][1] ** -0.5) for name in order]
    nbytes = sum(2 * w.numel() for w in weights)
    result = {"matmuls": len(order), "weight_bytes": nbytes}
    variants = {
        "ce::linear": lambda x, w, name: linear(x, w),
        "cuBLAS": lambda x, w, name: torch.nn.functional.linear(x, w),
    }
    if len(best) == len(shapes):
        variants["best swept config per shape"] = lambda x, w, name: gemv_kernels.skinny_gemm(x, w, best[name][1])
    for label, fn in variants.items():
        calls = [lambda w=w, name=name: fn(xs[w.shape[1]], w, name) for w, name in zip(weights, order)]
        us = graph_us_per_call(calls) * len(calls)
        gbps = nbytes / (us * 1e-6) / 1e9
        result[label] = {"us_per_step": round(us, 2), "frac_copy": round(gbps / copy_gbps, 4)}
        print(f"M={rows} step of {len(order)} matmuls, {label:<30} {us:8.1f} µs {gbps / copy_gbps:6.1%}", flush=True)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=lambda v: [int(r) for r in v.split(",")], default=[1, 2],
                        help=f"row counts, 1..{gemv_kernels.GEMV_MAX_ROWS}, comma-separated")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gemv_sweep needs a CUDA device")
    if not all(1 <= r <= gemv_kernels.GEMV_MAX_ROWS for r in args.rows):
        raise SystemExit(f"--rows takes row counts 1..{gemv_kernels.GEMV_MAX_ROWS}")
    start = time.time()
    copy_gbps = copy_bandwidth_gbps()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {copy_gbps:.0f} GB/s", flush=True)
    result = {"device": torch.cuda.get_device_name(), "copy_bandwidth_gbps": round(copy_gbps, 1), "rows": [],
              "best": {}, "step": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    for rows in args.rows:
        best = sweep(rows, copy_gbps, result["rows"])
        result["best"][rows] = {name: {"us": round(us, 3), "config": describe(c)} for name, (us, c) in best.items()}
        result["step"][rows] = whole_step(rows, best, copy_gbps)
        # written after each row count: a run cut short keeps what it measured
        (args.out / "gemv_sweep.json").write_text(json.dumps(result, indent=1))
    result["wall_s"] = round(time.time() - start, 1)
    (args.out / "gemv_sweep.json").write_text(json.dumps(result, indent=1))
    for rows, best in result["best"].items():
        for name, b in best.items():
            print(f"best M={rows} {name}: {b['us']:.2f} µs, {b['config']}")


if __name__ == "__main__":
    main()
