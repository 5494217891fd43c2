"""The model's chain of decode matmuls, each reading the one before, with their prologues: skinny GEMM configs chosen
where they run.

A batch-1 decode step is a chain of dependent kernels, launched with PDL (ops/triton/pdl.py): each matmul may start
while the one before still runs, prefetch weights, and must then wait for its input. How long a config takes there
depends on what it overlaps, so a config timed alone (the autotuner: one call, the L2 flushed, nothing before it)
can be ranked wrongly: the autotuner once picked 16 x 256 for out_proj's [1024, 2048] where 2 x 2048 takes a third
of the time in a chain (bench/results/h200-2026-11-30/run23-baseline). Here the 97 matmuls of a Qwen3.5-0.8B step run
in model order in one CUDA graph, as the model calls them: in_proj / qkv and gate_up with the residual add + RMSNorm
in their prologue (``add_rms_norm_skinny_gemm``), out_proj / o_proj reading the first 2,048 columns of the one
before, down with the SiLU gate in its prologue, lm_head last, every layer with its own weights (1.5 GB: DRAM, not
L2). Coordinate descent: each role's candidates are timed with the other roles fixed, the best kept, twice over.
The mixers' own kernels (GDN, attention) are not in the chain; it measures the matmuls' share of a step.

    python bench/gemv_chain.py --out DIR [--rows 1]     # DIR/gemv_chain.json, and a table on stdout
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ops/ beside bench/, as with PYTHONPATH=.

from bench.ops_microbench import Shape, copy_bandwidth_gbps, rand  # noqa: E402
from ops.triton import gemv_kernels  # noqa: E402
from ops.triton.gemv_kernels import _config  # noqa: E402

EPS = 1e-6
# (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages) per role kind at one row (the GEMV path): N = 1024 outputs
# (latency-bound: few weight bytes per program, whole rows in one or two loads), K = 1024 inputs with wide N, and
# the vocabulary.
NARROW = [(2, 2048, 1, 8, 1), (2, 4096, 1, 8, 1), (2, 1024, 1, 4, 2), (4, 1024, 1, 8, 2), (4, 2048, 1, 8, 1),
          (1, 2048, 1, 4, 1), (4, 512, 1, 4, 3)]
WIDE = [(8, 256, 1, 4, 4), (4, 512, 1, 4, 3), (8, 512, 1, 4, 3), (4, 1024, 1, 4, 2), (8, 1024, 1, 8, 2),
        (16, 256, 1, 8, 3), (2, 1024, 1, 4, 2), (16, 1024, 1, 8, 1)]
VOCAB = [(8, 256, 1, 4, 4), (8, 512, 1, 4, 3), (16, 256, 1, 4, 3), (4, 1024, 1, 4, 2), (32, 256, 1, 8, 3)]
# roles: name -> (N, K, prologue, candidate list); gdn_out_proj and attn_o_proj share a shape and a rule
ROLE_KINDS = {"gdn_in_proj": ("norm", WIDE), "out_proj": ("plain", NARROW), "mlp_gate_up": ("norm", WIDE),
              "mlp_down": ("gated", NARROW), "attn_qkv": ("norm", WIDE), "lm_head": ("plain", VOCAB)}


def roles(s: Shape) -> dict[str, tuple[int, int, str, list]]:
    shapes = s.weight_matmuls()
    shapes["out_proj"] = shapes.pop("gdn_out_proj")
    del shapes["attn_o_proj"]  # same [N, K] as out_proj
    return {name: (shapes[name][0], shapes[name][1], *ROLE_KINDS[name]) for name in ROLE_KINDS}


class Chain:
    """The step's matmuls with their own weights, run in model order at ``rows`` rows with a config per role."""

    def __init__(self, s: Shape, rows: int):
        self.s, self.rows = s, rows
        self.roles = roles(s)
        self.layers = []
        for layer in range(s.layers):
            full = (layer + 1) % s.full_attention_interval == 0
            mixer = "attn_qkv" if full else "gdn_in_proj"
            self.layers.append({
                "mixer": mixer,
                "w_mix": self._weight(mixer), "w_out": self._weight("out_proj"),
                "w_gate_up": self._weight("mlp_gate_up"), "w_down": self._weight("mlp_down"),
                "norm_1": rand(s.hidden, scale=0.1), "norm_2": rand(s.hidden, scale=0.1),
            })
        self.w_lm = self._weight("lm_head")
        self.hidden = rand(rows, s.hidden)
        self.residual = rand(rows, s.hidden)
        self.weight_bytes = 2 * sum(w.numel() for layer in self.layers for k, w in layer.items() if k.startswith("w_"))
        self.weight_bytes += 2 * self.w_lm.numel()

    def _weight(self, role: str) -> torch.Tensor:
        n, k = self.roles[role][:2]
        return rand(n, k, scale=k**-0.5)

    def run(self, configs: dict) -> torch.Tensor:
        block_m = gemv_kernels.block_rows(self.rows)
        gemm, norm_gemm = gemv_kernels.skinny_gemm, gemv_kernels.add_rms_norm_skinny_gemm
        h, r = self.hidden, self.residual
        for layer in self.layers:
            mixer = layer["mixer"]
            y, r = norm_gemm(h, r, layer["norm_1"], EPS, layer["w_mix"], configs[mixer], block_m)
            h = gemm(y[:, : self.roles["out_proj"][1]], layer["w_out"], configs["out_proj"], block_m)
            g, r = norm_gemm(h, r, layer["norm_2"], EPS, layer["w_gate_up"], configs["mlp_gate_up"], block_m)
            h = gemm(g, layer["w_down"], configs["mlp_down"], block_m, gated=True)
        return gemm(h, self.w_lm, configs["lm_head"], block_m)

    def step_us(self, configs: dict) -> float:
        """Median µs of one CUDA-graph replay of the chain (the configs' kernels compiled first, outside it)."""
        import triton.testing

        self.run(configs)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.run(configs)
        us = triton.testing.do_bench(graph.replay, warmup=10, rep=60, return_mode="median") * 1e3
        del graph
        return us


def descend(chain: Chain, start: dict, passes: int, log) -> tuple[dict, float, list]:
    """Coordinate descent over the roles' candidates: returns (configs, µs a step, every timing)."""
    configs = {role: _config(*c) for role, c in start.items()}
    best_us = chain.step_us(configs)
    timings = [{"pass": 0, "role": None, "config": None, "us": round(best_us, 2)}]
    log(f"start: {best_us:.1f} µs a step")
    for p in range(1, passes + 1):
        for role, (n, k, prologue, candidates) in chain.roles.items():
            for c in candidates:
                trial = {**configs, role: _config(*c)}
                try:
                    us = chain.step_us(trial)
                except Exception as exc:  # noqa: BLE001 - a config that does not compile or fit: note it, go on
                    log(f"  {role} {c}: {type(exc).__name__}: {str(exc)[:160]}")
                    continue
                timings.append({"pass": p, "role": role, "config": c, "us": round(us, 2)})
                log(f"  pass {p} {role:<12} [{n:>6}, {k:>4}] {prologue:<5} {str(c):<24} {us:8.1f} µs a step")
                if us < best_us:
                    best_us, configs = us, trial
        log(f"after pass {p}: {best_us:.1f} µs a step")
    return configs, best_us, timings


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=1, help="rows of x (1: the GEMV path; the descent's lists are its)")
    parser.add_argument("--passes", type=int, default=2)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gemv_chain needs a CUDA device")
    if gemv_kernels.block_rows(args.rows) != 1:
        raise SystemExit("gemv_chain's candidate lists are the GEMV path's (--rows 1)")
    start_time = time.time()
    copy_gbps = copy_bandwidth_gbps()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {copy_gbps:.0f} GB/s", flush=True)
    chain = Chain(Shape(), args.rows)
    bound_us = chain.weight_bytes / (copy_gbps * 1e9) * 1e6
    rule = {role: _config_tuple(gemv_kernels.gemv_config(n, k)) for role, (n, k, _, _) in chain.roles.items()}
    rule_us = chain.step_us({role: _config(*c) for role, c in rule.items()})
    print(f"rule (gemv_kernels.gemv_config): {rule_us:.1f} µs a step, bound {bound_us:.1f} µs", flush=True)
    configs, best_us, timings = descend(chain, rule, args.passes, lambda line: print(line, flush=True))
    result = {
        "device": torch.cuda.get_device_name(), "copy_bandwidth_gbps": round(copy_gbps, 1), "rows": args.rows,
        "weight_bytes": chain.weight_bytes, "bound_us": round(bound_us, 2),
        "rule": {"configs": rule, "us": round(rule_us, 2)},
        "best": {"configs": {role: _config_tuple(c) for role, c in configs.items()}, "us": round(best_us, 2)},
        "timings": timings, "wall_s": round(time.time() - start_time, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gemv_chain.json").write_text(json.dumps(result, indent=1))
    for role, c in result["best"]["configs"].items():
        print(f"best {role}: {c}")
    print(f"chain: rule {rule_us:.1f} µs, best {best_us:.1f} µs, bound {bound_us:.1f} µs "
          f"({bound_us / best_us:.1%} of copy bandwidth)")


def _config_tuple(c) -> tuple:
    return (c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.kwargs["SPLIT_K"], c.num_warps, c.num_stages)


if __name__ == "__main__":
    main()
