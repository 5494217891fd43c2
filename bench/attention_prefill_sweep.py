"""Prefill attention configs timed on a prompt step's shapes: data for choosing ``paged_attention_prefill``'s config.

A fresh prompt of 8,192 tokens (c1's time to first token) and 16 prompts of 512 tokens (a c16 prefill step), the
Qwen3.5-0.8B attention shape (8 query heads, 2 KV heads, head_dim 256, block_size 16, bf16). Each candidate
(rows a program, BLOCK_N, warps, stages) is checked against the chosen tile's output (``prefill_tile``), then timed
(CUDA events, median of the repeats). Beside them, torch's ``scaled_dot_product_attention`` on the same unpaged tensors (causal, GQA): the figure a well-tuned dense kernel
reaches on this GPU, not a drop-in (it knows no block tables).

    python bench/attention_prefill_sweep.py --out DIR      # JSON in DIR/attention_prefill_sweep.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ops/ beside bench/, as with PYTHONPATH=.

from ops.triton.paged_attention_kernels import PrefillTile, paged_attention_prefill, prefill_tile  # noqa: E402

HQ, HKV, D, BLOCK = 8, 2, 256, 16


def _case(seqs: int, length: int, device: str):
    gen = torch.Generator(device=device).manual_seed(0)
    total = seqs * length
    q = torch.randn(total, HQ, D, device=device, dtype=torch.bfloat16, generator=gen)
    k = torch.randn(total, HKV, D, device=device, dtype=torch.bfloat16, generator=gen)
    v = torch.randn(total, HKV, D, device=device, dtype=torch.bfloat16, generator=gen)
    blocks = length // BLOCK
    k_cache = k.view(seqs * blocks, BLOCK, HKV, D)  # block b of sequence n at row n * blocks + b: its own table
    v_cache = v.view(seqs * blocks, BLOCK, HKV, D)
    tables = torch.arange(seqs * blocks, device=device, dtype=torch.int32).view(seqs, blocks)
    cu = torch.arange(0, total + 1, length, device=device, dtype=torch.int32)
    lens = torch.full((seqs,), length, device=device, dtype=torch.int32)
    return q, k, v, k_cache, v_cache, cu, lens, tables


def time_ms(fn, repeats: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", default="1x8192,16x512")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for case in args.cases.split(","):
        seqs, length = (int(x) for x in case.split("x"))
        q, k, v, k_cache, v_cache, cu, lens, tables = _case(seqs, length, "cuda")
        scale = D ** -0.5
        flops = 4 * seqs * (length * (length + 1) / 2) * HQ * D  # QK^T and PV over the causal triangle
        ref = paged_attention_prefill(q, k_cache, v_cache, cu, lens, tables, scale)
        qd = q.view(seqs, length, HQ, D).transpose(1, 2)
        kd = k.view(seqs, length, HKV, D).transpose(1, 2)
        vd = v.view(seqs, length, HKV, D).transpose(1, 2)
        sdpa_ms = time_ms(lambda: F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scale,
                                                                  enable_gqa=True))
        sdpa_err = (F.scaled_dot_product_attention(qd, kd, vd, is_causal=True, scale=scale, enable_gqa=True)
                    .transpose(1, 2).reshape_as(ref).float() - ref.float()).abs().max().item()
        print(f"{case}: torch SDPA {sdpa_ms:.3f} ms ({flops / sdpa_ms / 1e9:.0f} TFLOP/s), |diff| {sdpa_err:.2e}",
              flush=True)
        results.append({"case": case, "config": "torch sdpa", "ms": sdpa_ms, "tflops": flops / sdpa_ms / 1e9,
                        "max_abs_diff": sdpa_err})
        chosen = prefill_tile(D, dot_fp32=False)
        grid = [chosen] + [PrefillTile(*c) for c in itertools.product((64, 128), (32, 64), (4, 8), (2, 3, 4))
                           if PrefillTile(*c) != chosen]
        for tile in grid:
            config = {"rows": tile.rows, "block_n": tile.block_n, "num_warps": tile.num_warps,
                      "num_stages": tile.num_stages, "chosen": tile == chosen}
            try:
                call = lambda: paged_attention_prefill(q, k_cache, v_cache, cu, lens, tables, scale, tile)  # noqa
                err = (call().float() - ref.float()).abs().max().item()
                ms = time_ms(call, repeats=10)
            except Exception as exc:  # out of shared memory, register spills past a limit: not a candidate
                print(f"{case} {config}: {type(exc).__name__}: {str(exc)[:100]}", flush=True)
                continue
            results.append({"case": case, "config": config, "ms": ms, "tflops": flops / ms / 1e9,
                            "max_abs_diff": err})
            print(f"{case} {config}: {ms:.3f} ms ({flops / ms / 1e9:.0f} TFLOP/s), |diff| {err:.1e}", flush=True)
        best = sorted((r for r in results if r["case"] == case and r["config"] != "torch sdpa"),
                      key=lambda r: r["ms"])[:8]
        print(f"{case} best:", *(f"  {r['ms']:.3f} ms {r['config']}" for r in best), sep="\n", flush=True)
        (args.out / "attention_prefill_sweep.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
