"""Causal conv decode configs timed at the batch sizes of the throughput and long-context workloads: data for
``ce::causal_conv1d_decode``'s channel block and warps.

``ce::causal_conv1d_decode`` is a Gated DeltaNet layer's conv step past the fused kernel's batch sizes
(ops/triton/gated_deltanet_kernels.py ``DECODE_LAUNCHES``). Qwen3.5-0.8B's shape: 6,144 channels (q | k | v), width
4, a bf16 conv pool, the input a strided view of the in_proj rows as the model passes it, each sequence on its own
slot. Per batch every candidate
(BLOCK_C, warps) is checked against the default config's output and history (exact: the same math), then timed as
20 calls in one CUDA graph (median of the replays). The bound is the bytes a call moves (history read and written,
input read, output written) at the copy bandwidth measured in the same process.

    python bench/conv_decode_sweep.py --out DIR [--batches 16,64,256,512]
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ops/ beside bench/, as with PYTHONPATH=.

from bench.attention_decode_sweep import graph_us  # noqa: E402
from bench.ops_microbench import copy_bandwidth_gbps  # noqa: E402
from ops.triton.conv1d_kernels import causal_conv1d_decode  # noqa: E402

CHANNELS, WIDTH, ROW = 6144, 4, 8224  # conv channels, kernel width, the in_proj row it is a view of


def _case(batch: int):
    gen = torch.Generator(device="cuda").manual_seed(0)
    projected = torch.randn(batch, ROW, device="cuda", dtype=torch.bfloat16, generator=gen)
    weight = torch.randn(CHANNELS, WIDTH, device="cuda", dtype=torch.bfloat16, generator=gen) * 0.5
    state = torch.randn(batch + 1, CHANNELS, WIDTH - 1, device="cuda", dtype=torch.bfloat16, generator=gen)
    slots = (torch.randperm(batch, device="cuda", generator=gen) + 1).to(torch.int32)
    return projected[:, :CHANNELS], weight, state, slots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", default="16,64,256,512")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    gbps = copy_bandwidth_gbps()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {gbps:.0f} GB/s", flush=True)
    results = []
    for batch in (int(b) for b in args.batches.split(",")):
        x, weight, state, slots = _case(batch)
        bound_us = batch * CHANNELS * (2 * (WIDTH - 1) + 2) * 2 / (gbps * 1e3)
        defaults = inspect.signature(causal_conv1d_decode).parameters
        chosen = (defaults["block_c"].default, defaults["num_warps"].default)
        want_state = state.clone()
        want = causal_conv1d_decode(x, weight, want_state, slots)
        grid = [chosen] + [c for c in itertools.product((128, 256, 512, 1024, 2048), (1, 2, 4, 8)) if c != chosen]
        for block_c, warps in grid:
            config = {"block_c": block_c, "num_warps": warps, "chosen": (block_c, warps) == chosen}
            got_state = state.clone()
            got = causal_conv1d_decode(x, weight, got_state, slots, block_c=block_c, num_warps=warps)
            exact = torch.equal(got, want) and torch.equal(got_state, want_state)
            work = state.clone()
            us = graph_us(lambda: causal_conv1d_decode(x, weight, work, slots, block_c=block_c,  # noqa: B023
                                                        num_warps=warps))
            results.append({"batch": batch, "config": config, "us": us, "frac_bound": bound_us / us, "exact": exact})
            flag = "" if exact else " NOT EXACT"
            print(f"B={batch} {config}: {us:.2f} µs ({bound_us / us:.1%} of {bound_us:.2f}){flag}", flush=True)
        mine = sorted((r for r in results if r["batch"] == batch and r["exact"]), key=lambda r: r["us"])
        default = next(r for r in results if r["batch"] == batch and r["config"]["chosen"])
        print(f"B={batch} default {default['us']:.2f} µs ({default['frac_bound']:.1%}); best:",
              *(f"  {r['us']:.2f} µs ({r['frac_bound']:.1%}) {r['config']}" for r in mine[:5]), sep="\n", flush=True)
        (args.out / "conv_decode_sweep.json").write_text(json.dumps(
            {"copy_bandwidth_gbps": gbps, "results": results}, indent=1))


if __name__ == "__main__":
    main()
