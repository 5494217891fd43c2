"""Microbenchmark of ``ce::sample`` (ops/sample.py) at the Qwen3.5 vocabulary, against greedy ``ce::argmax`` and the
torch sampler it replaced (a full-vocabulary sort per row for top-k / top-p, softmax, cumsum, scatter, and the noise
as ~20 int64 elementwise kernels over ``[B, V]``, reproduced below as the baseline).

Each call runs as a captured CUDA graph (as in a decode step) and is timed with ``triton.testing.do_bench`` (median,
L2 flushed before each call), on bf16 logits ``[B, 248320]`` with the same sampling configuration in every row.
Configurations with top-k or top-p are also timed with the row path off (``radix_us``: every row through the radix
passes).

    python bench/sample_microbench.py                      # table on stdout
    python bench/sample_microbench.py --batches 1 64 --out results/sample_microbench.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ops/ beside bench/, as with PYTHONPATH=.

import ops  # noqa: E402,F401  (registers torch.ops.ce)
from ops.sample import uniform_noise  # noqa: E402
from ops.triton import sample_kernels  # noqa: E402

VOCAB = 248320
CONFIGS = {  # name: (temperature, top_k, top_p, min_p, logit scale)
    "temperature": (0.8, 0, 1.0, 0.0, 1),
    "top_k 20, top_p 0.95": (0.7, 20, 0.95, 0.0, 1),
    "top_p 0.9": (1.0, 0, 0.9, 0.0, 1),
    # Logits x 4 (std 12): a nucleus of a few tokens, as a language model's usually is, which the row path takes.
    "top_p 0.9, peaked logits": (1.0, 0, 0.9, 0.0, 4),
    "top_k 50": (1.0, 50, 1.0, 0.0, 1),
    "min_p 0.05": (1.0, 0, 1.0, 0.05, 1),
    "all": (0.9, 40, 0.9, 0.02, 1),
}


def torch_sampler(logits, temperature, top_k, top_p, min_p, seeds, counters):
    """The sort-based torch sampler ce::sample replaced (compiled_engine/sampler.py before the op)."""
    logits = logits.float() / temperature[:, None]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, logits.shape[-1]))
    sorted_logits = sorted_logits.masked_fill(ranks >= k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    drop = (probs.cumsum(dim=-1) - probs >= top_p[:, None]) & (top_p[:, None] < 1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    probs = probs.masked_fill(probs < min_p[:, None] * probs.max(dim=-1, keepdim=True).values, 0.0)
    return (probs / -torch.log(uniform_noise(seeds, counters, logits.shape[-1]))).argmax(dim=-1)


def bench_us(fn) -> float:
    import triton.testing

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, warmup=10, rep=60, return_mode="median") * 1e3


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--out", type=Path, default=None, help="a JSON file for the rows")
    args = parser.parse_args(argv)
    rows = []
    for batch in args.batches:
        logits = (torch.randn(batch, VOCAB, device="cuda") * 3).to(torch.bfloat16)
        seeds = torch.arange(batch, device="cuda") * 7919 + 1
        counters = torch.zeros(batch, dtype=torch.long, device="cuda")
        us = bench_us(lambda: torch.ops.ce.argmax(logits))
        rows.append({"batch": batch, "what": "greedy ce::argmax", "us": round(us, 2)})
        print(f"B={batch:<4} {'greedy ce::argmax':<28} {us:9.2f} us", flush=True)
        base = logits
        for name, (t, k, p, mp, scale) in CONFIGS.items():
            logits = base * scale
            params = [torch.full((batch,), v, device="cuda", dtype=d) for v, d in
                      ((t, torch.float32), (k, torch.long), (p, torch.float32), (mp, torch.float32))]
            flags = (k > 0, p < 1)
            op_us = bench_us(lambda: torch.ops.ce.sample(logits, *params, seeds, counters, *flags))
            torch_us = bench_us(lambda: torch_sampler(logits, *params, seeds, counters))
            row = {"batch": batch, "what": name, "us": round(op_us, 2), "torch_us": round(torch_us, 2)}
            radix = ""
            if k > 0 or p < 1:
                row["radix_us"] = round(bench_us(lambda: sample_kernels.sample(
                    logits, *params, seeds, counters, *flags, row_candidates=0)), 2)
                radix = f", radix passes only {row['radix_us']:9.2f} us"
            rows.append(row)
            print(f"B={batch:<4} {name:<28} {op_us:9.2f} us  (torch sampler {torch_us:9.2f} us{radix})", flush=True)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
