"""The model's chain of decode matmuls, each reading the one before, with their prologues: skinny GEMM configs chosen
where they run, at each row count (decode batch) of the skinny GEMM.

A decode step is a chain of dependent kernels, launched with PDL (ops/triton/pdl.py): each matmul may start while
the one before still runs, prefetch weights, and must then wait for its input. How long a config takes there depends
on what it overlaps, so a config timed alone (as ``triton.autotune`` times it: one call, the L2 flushed, nothing
before it) can be ranked wrongly. Here the 97 matmuls of a Qwen3.5-0.8B step run in model order in one CUDA graph,
as the model calls them: in_proj / qkv and gate_up after the residual add + RMSNorm (in their prologue at one row,
``add_rms_norm_skinny_gemm``; ce::add_rms_norm before them from two), gate_up writing the SiLU gate's output,
out_proj / o_proj reading the first 2,048 columns of the one before, lm_head last, every layer with its own weights
(1.5 GB: DRAM, not L2). The mixers' own kernels (GDN, attention) are not in the chain; it measures the matmuls' share
of a step. The bound is the weights' bytes at the copy bandwidth, the same at every row count.

For each row count in ``--rows`` (1..GEMV_MAX_ROWS), the chain runs (µs a step and % of the bound):
  * ``rule``: the skinny GEMM's configs by rule (``gemv_kernels.skinny_config``: the one-row GEMV at one row, the
    few-rows GEMV above), with the prologues as ce::linear runs them (the norm in the GEMV at one row, as
    ce::add_rms_norm before it from two), what ce::linear runs up to ``SKINNY_MAX_ROWS`` rows (ops/linear.py). Past
    it ce::linear runs cuBLAS; the rule's timing there says whether raising ``SKINNY_MAX_ROWS`` would pay;
  * ``cuBLAS``: ce::linear's other path (``CE_SKINNY_GEMM=0``): ce::add_rms_norm / ce::silu_mul, then F.linear;
  * ``rule, lm_head GEMV`` (2..GEMV_MAX_ROWS rows): the rule with the vocabulary on the few-rows GEMV instead of the
    tensor-core loop (``gemv_kernels.DOT_VOCAB``); ``cuBLAS, lm_head dot`` (past SKINNY_MAX_ROWS): cuBLAS with the
    vocabulary on the tensor-core loop; ``dot`` (past SKINNY_MAX_ROWS): every role on the tensor-core loop
    (``DOT_START``), the descent's start there.
The log marks the one ce::linear runs at that row count.
With ``--passes`` > 0, then a coordinate descent per row count, from the fastest of those: each role's GEMV
candidates (with ``--dot`` the tensor-core loop's too) timed with the other roles fixed, the best kept, ``passes``
times over.

    python bench/gemv_chain.py --out DIR --rows 1,2,4,8 --passes 0   # rule against cuBLAS, under a minute
    python bench/gemv_chain.py --out DIR --rows 2,4 --passes 0 --profile   # and each one's time per kernel
    python bench/gemv_chain.py --out DIR [--rows 1]                  # the one-row descent (gemv_config's data)
    python bench/gemv_chain.py --out DIR --rows 1,3 --passes 0 --flags FULL_TILES=0   # the rule, a switch flipped
    python bench/gemv_chain.py --out DIR --rows 3 --passes 1 --roles mlp_down,out_proj   # those roles' tiles only

DIR/gemv_chain.json has every timing; written after each row count, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ops/ beside bench/, as with PYTHONPATH=.

from bench.ops_microbench import Shape, copy_bandwidth_gbps, rand  # noqa: E402
from ops.linear import SKINNY_MAX_ROWS, norm_in_prologue  # noqa: E402
from ops.triton import gemv_kernels  # noqa: E402
from ops.triton.gemv_kernels import _config  # noqa: E402

EPS = 1e-6
# One-row descent candidates (BLOCK_N, BLOCK_K, num_warps, num_stages) per role kind (the one-row GEMV): N = 1024
# outputs (latency-bound: few weight bytes per program, whole rows in one or two loads), K = 1024 inputs with wide N,
# and the vocabulary.
NARROW = [(2, 2048, 8, 1), (2, 4096, 8, 1), (2, 1024, 4, 2), (4, 1024, 8, 2), (4, 2048, 8, 1), (1, 2048, 4, 1),
          (4, 512, 4, 3)]
WIDE = [(8, 256, 4, 4), (4, 512, 4, 3), (8, 512, 4, 3), (4, 1024, 4, 2), (8, 1024, 8, 2), (16, 256, 8, 3),
        (2, 1024, 4, 2), (16, 1024, 8, 1)]
VOCAB = [(8, 256, 4, 4), (8, 512, 4, 3), (16, 256, 4, 3), (4, 1024, 4, 2), (32, 256, 8, 3)]
# 2..GEMV_MAX_ROWS-row descent candidates (BLOCK_N, BLOCK_K, num_warps, num_stages) for the few-rows GEMV, BLOCK_M
# from the row count as the rule sets it. BLOCK_K is 256 x num_warps (see gemv_kernels); entries are skipped where the
# tile's rows x BLOCK_N > 40 (they spill: ~8 registers a thread per output); a tile's rows are BLOCK_M, or BLOCK_M / 2
# + 1 where the launch runs the last row apart (``EXTRA_ROW``: 5 rows as 4 + 1, whose 4 + 1 x 8 compiles to 165-190
# registers and no spill for sm_90a, where the rule's 8 x 4 budget gives it 4 columns).
# The 1- and 2-warp entries: programs that loop over K = 1,024 in 2-4 chunks (each chunk's loads issued one
# iteration ahead, as the one-row rule's 8 x 256 does) instead of one or two 1,024-wide chunks; at 4 warps the wide
# roles' 4 x 1,024 tiles make N / 4 programs that each load once (1.5 waves of 64-register programs for in_proj).
NARROW_ROWS = [(2, 2048, 8, 1), (4, 2048, 8, 1), (8, 2048, 8, 1), (2, 512, 2, 1), (4, 256, 1, 1)]
WIDE_ROWS = [(4, 1024, 4, 1), (8, 1024, 4, 1), (2, 1024, 4, 1), (4, 512, 2, 1), (8, 512, 2, 1), (8, 256, 1, 1)]
VOCAB_ROWS = [(8, 512, 2, 1), (4, 1024, 4, 1)]
# Tensor-core candidates for `--dot` (BLOCK_N, BLOCK_K, num_warps, num_stages; BLOCK_M 8 or 16 from the row count):
# mostly 1-2 warps of 16-row mma tiles per program (Triton's mma.sync path; 4 warps of a 64-row tile take wgmma), so
# that down's SiLU prologue runs once per warp over few weight rows.
WIDE_DOT = [(64, 128, 2, 3), (32, 128, 1, 3), (64, 256, 2, 2), (128, 128, 4, 3), (64, 128, 4, 3), (16, 256, 1, 3)]
NARROW_DOT = [(16, 256, 1, 3), (32, 128, 1, 3), (32, 256, 2, 3), (16, 128, 1, 4), (16, 512, 1, 2)]
VOCAB_DOT = [(64, 128, 2, 3), (128, 128, 4, 3), (128, 64, 4, 4), (256, 64, 8, 3)]
# Past SKINNY_MAX_ROWS, the chain with every role on the tensor-core loop (the descent's start there), per role kind
DOT_START = {"norm": (32, 128, 1, 3), "plain": (16, 256, 1, 3)}

# roles: name -> (prologue, one-row candidates, 2..GEMV_MAX_ROWS-row candidates, tensor-core candidates);
# gdn_out_proj and attn_o_proj share a shape; mlp_down's input is gate_up's activated output (its SiLU gate in
# gate_up's epilogue: "plain"; the "dot" variant, whose gate_up has no epilogue, reads [gate | up] instead)
ROLE_KINDS = {"gdn_in_proj": ("norm", WIDE, WIDE_ROWS, WIDE_DOT),
              "out_proj": ("plain", NARROW, NARROW_ROWS, NARROW_DOT),
              "mlp_gate_up": ("norm", WIDE, WIDE_ROWS, WIDE_DOT),
              "mlp_down": ("plain", NARROW, NARROW_ROWS, NARROW_DOT),
              "attn_qkv": ("norm", WIDE, WIDE_ROWS, WIDE_DOT),
              "lm_head": ("plain", VOCAB, VOCAB_ROWS, VOCAB_DOT)}


def roles(s: Shape) -> dict[str, tuple[int, int, str, list, list, list]]:
    shapes = s.weight_matmuls()
    shapes["out_proj"] = shapes.pop("gdn_out_proj")
    del shapes["attn_o_proj"]  # same [N, K] as out_proj
    return {name: (shapes[name][0], shapes[name][1], *ROLE_KINDS[name]) for name in ROLE_KINDS}


def rows_config(rows: int, candidate: tuple) -> triton.Config:
    """A 2..GEMV_MAX_ROWS-row candidate as a config, with the BLOCK_M the rule gives ``rows``."""
    return _config(*candidate, block_m=max(2, triton.next_power_of_2(rows)))


def tile_rows(rows: int, config: triton.Config) -> int:
    """The rows of x a program of ``config`` holds at ``rows`` rows: its BLOCK_M, or BLOCK_M / 2 + 1 with the extra
    row (gemv_kernels.row_tiles)."""
    tiles = gemv_kernels.row_tiles(rows, config)
    return tiles["BLOCK_M"] + tiles["EXTRA_ROW"]


def dot_configs(roles_: dict) -> dict:
    """Every role on the tensor-core loop: ``DOT_START``'s tile by role kind, the vocabulary on ``DOT_VOCAB``."""
    return {role: gemv_kernels.DOT_VOCAB if role == "lm_head" else _config(*DOT_START[prologue], dot=True)
            for role, (n, k, prologue, *_) in roles_.items()}


def config_tuple(c) -> tuple:
    """A config as (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages[, "dot"]), for the JSON and the log."""
    kw = c.kwargs
    return (kw.get("BLOCK_M", 1), kw["BLOCK_N"], kw["BLOCK_K"], c.num_warps, c.num_stages) + (("dot",) if kw.get("DOT")
                                                                                             else ())


class Chain:
    """The step's matmuls with their own weights, run in model order with a config per role (or cuBLAS) at a given
    row count."""

    def __init__(self, s: Shape):
        self.s = s
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
        self.weight_bytes = 2 * sum(w.numel() for layer in self.layers for k, w in layer.items() if k.startswith("w_"))
        self.weight_bytes += 2 * self.w_lm.numel()
        self.rows = 0
        self.set_rows(1)

    def _weight(self, role: str) -> torch.Tensor:
        n, k = self.roles[role][:2]
        return rand(n, k, scale=k**-0.5)

    def set_rows(self, rows: int) -> None:
        if rows != self.rows:
            self.rows = rows
            self.hidden = rand(rows, self.s.hidden)
            self.residual = rand(rows, self.s.hidden)

    def run(self, configs: dict | None, mode: str = "skinny") -> torch.Tensor:
        """``mode``: "skinny" (``configs``: role -> config; the rule's where a role has none), "skinny_down_prologue"
        (the same with the SiLU gate in down's prologue instead of gate_up's epilogue), "cublas", or
        "cublas_dot_vocab" (cuBLAS but the lm_head, on the skinny GEMM's tensor-core loop)."""
        if mode.startswith("cublas"):
            return self._run_cublas(dot_vocab=mode == "cublas_dot_vocab")
        configs = configs or {}
        gemm = gemv_kernels.skinny_gemm
        gate_in_down = mode == "skinny_down_prologue"

        def norm_gemm(x, residual, norm_weight, weight, config, gated_out=False):  # as ops/linear.py's norm ops
            if norm_in_prologue(self.rows):
                return gemv_kernels.add_rms_norm_skinny_gemm(x, residual, norm_weight, EPS, weight, config,
                                                             gated_out=gated_out)
            summed, normed = torch.ops.ce.add_rms_norm(x, residual, norm_weight, EPS)
            return gemm(normed, weight, config, gated_out=gated_out), summed

        h, r = self.hidden, self.residual
        out_k = self.roles["out_proj"][1]
        for layer in self.layers:
            y, r = norm_gemm(h, r, layer["norm_1"], layer["w_mix"], configs.get(layer["mixer"]))
            h = gemm(y[:, :out_k], layer["w_out"], configs.get("out_proj"))
            g, r = norm_gemm(h, r, layer["norm_2"], layer["w_gate_up"], configs.get("mlp_gate_up"),
                             gated_out=not gate_in_down)
            h = gemm(g, layer["w_down"], configs.get("mlp_down"), gated=gate_in_down)
        return gemm(h, self.w_lm, configs.get("lm_head"))

    def _run_cublas(self, dot_vocab: bool = False) -> torch.Tensor:
        from ops.options import use_options

        h, r = self.hidden, self.residual
        out_k = self.roles["out_proj"][1]
        with use_options(skinny_gemm=False):  # ce::linear's cuBLAS path, its separate norm and activation kernels
            for layer in self.layers:
                y, r = torch.ops.ce.add_rms_norm_linear(h, r, layer["norm_1"], EPS, layer["w_mix"])
                h = torch.ops.ce.linear(y[:, :out_k], layer["w_out"])
                g, r = torch.ops.ce.add_rms_norm_linear_silu_mul(h, r, layer["norm_2"], EPS, layer["w_gate_up"])
                h = torch.ops.ce.linear(g, layer["w_down"])
            if dot_vocab:
                return gemv_kernels.skinny_gemm(h, self.w_lm, gemv_kernels.DOT_VOCAB)
            return torch.ops.ce.linear(h, self.w_lm)

    def graph(self, configs: dict | None, mode: str = "skinny", flags: dict | None = None) -> torch.cuda.CUDAGraph:
        """The chain captured in a CUDA graph (compiled first, outside it); ``flags``: gemv_kernels' module switches
        set to these values while it is compiled and captured (the launches read them)."""
        saved = {name: getattr(gemv_kernels, name) for name in flags or {}}
        try:
            for name, value in (flags or {}).items():
                setattr(gemv_kernels, name, value)
            self.run(configs, mode)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.run(configs, mode)
        finally:
            for name, value in saved.items():
                setattr(gemv_kernels, name, value)
        return graph

    def step_us(self, configs: dict | None, mode: str = "skinny", flags: dict | None = None) -> float:
        """Median µs of one CUDA-graph replay of the chain."""
        import triton.testing

        return triton.testing.do_bench(self.graph(configs, mode, flags).replay, warmup=10, rep=60,
                                       return_mode="median") * 1e3


def profile(chain: Chain, configs: dict | None, mode: str, log, top: int = 8) -> dict:
    """Where one replay of the chain's graph spends its time, per kernel and grid (bench/latency.py's
    ``critical_path``: each kernel charged from the previous kernel's end to its own; the skinny GEMM's roles differ
    by grid), the ``top`` charges logged."""
    from bench.latency import critical_path_lines, profiled_critical_path

    path = profiled_critical_path(chain.graph(configs, mode).replay, 6)
    for line in critical_path_lines(path, "critical path", top, indent=4):
        log(line)
    return path


def compare(chain: Chain, rows: int, bound_us: float, log, with_profile: bool = False,
            flag_sets: list[dict] = ()) -> dict:
    """The rule and cuBLAS at ``rows`` rows (see the module docstring): label -> {"us", "frac_bound", configs} or an
    error. ``flag_sets``: the rule again under each set of gemv_kernels switches (``--flags``)."""
    chain.set_rows(rows)
    variants = {}
    if rows <= gemv_kernels.GEMV_MAX_ROWS:
        rule = {role: gemv_kernels.skinny_config(rows, n, k) for role, (n, k, *_) in chain.roles.items()}
        variants["rule"] = ("skinny", rule)
        for flags in flag_sets:
            label = "rule, " + ",".join(f"{name}={value}" for name, value in flags.items())
            variants[label] = ("skinny", rule, flags)
    variants["cuBLAS"] = ("cublas", None)
    if 1 < rows <= gemv_kernels.GEMV_MAX_ROWS:  # the vocabulary's other path: the few-rows GEMV
        n, k = chain.roles["lm_head"][:2]
        variants["rule, lm_head GEMV"] = ("skinny", {**rule, "lm_head": gemv_kernels.gemv_rows_config(rows, n, k)})
    if rows > SKINNY_MAX_ROWS:  # ce::linear's cuBLAS, but the vocabulary on the tensor-core loop
        variants["cuBLAS, lm_head dot"] = ("cublas_dot_vocab", None)
        variants["dot"] = ("skinny_down_prologue", dot_configs(chain.roles))  # every role on the tensor-core loop
    ours = "rule" if rows <= SKINNY_MAX_ROWS else "cuBLAS"  # what ce::linear runs at this row count
    results = {}
    rule_us = None
    for label, (mode, configs, *flags) in variants.items():
        start = time.time()
        try:
            us = chain.step_us(configs, mode, *flags)
        except Exception as exc:  # noqa: BLE001 - a path that does not compile or fit: note it, go on
            results[label] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}".replace("\n", " ")}
            log(f"M={rows:<2} {label:<28} {results[label]['error']}")
            continue
        entry = {"us": round(us, 2), "frac_bound": round(bound_us / us, 4)}
        if configs is not None:
            entry["configs"] = {role: config_tuple(c) for role, c in configs.items()}
            entry["_configs"] = configs  # popped before the JSON: the descent may start from them
        results[label] = entry
        first = next(iter(variants))  # the rule, or cuBLAS past the GEMV's rows: the others are compared with it
        rule_us = us if label == first else rule_us
        delta = f"{us - rule_us:+8.1f} vs {first}" if rule_us is not None and label != first else ""
        mark = "  <- ce::linear" if label == ours else ""
        log(f"M={rows:<2} {label:<28} {us:8.1f} µs  {bound_us / us:6.1%} of the bound  {delta}  "
            f"({time.time() - start:.1f} s){mark}")
        if with_profile:
            entry["critical_path"] = profile(chain, configs, mode, log)
    return results


def descend(chain: Chain, rows: int, start: dict, passes: int, log, dot: bool = False,
            only: list[str] | None = None) -> tuple[dict, float, list]:
    """Coordinate descent over the roles' candidates at ``rows`` rows: (configs, µs a step, every timing). ``dot``:
    the tensor-core candidates, besides the GEMV's (up to GEMV_MAX_ROWS rows); ``only``: the roles it varies (else
    every one)."""
    chain.set_rows(rows)
    configs = dict(start)
    best_us = chain.step_us(configs)
    timings = [{"pass": 0, "role": None, "config": None, "us": round(best_us, 2)}]
    log(f"M={rows} start: {best_us:.1f} µs a step")
    for p in range(1, passes + 1):
        for role, (n, k, prologue, one_row, more_rows, dots) in chain.roles.items():
            if only and role not in only:
                continue
            if rows == 1:
                candidates = [_config(*c) for c in one_row]
            elif rows <= gemv_kernels.GEMV_MAX_ROWS:
                candidates = [c for c in map(functools.partial(rows_config, rows), more_rows)
                              if tile_rows(rows, c) * c.kwargs["BLOCK_N"] <= 40]
            else:
                candidates = []
            if dot and rows > 1:
                candidates += [_config(*c, dot=True) for c in dots]  # BLOCK_M from the row count at launch
            for c in candidates:
                trial = {**configs, role: c}
                try:
                    us = chain.step_us(trial)
                except Exception as exc:  # noqa: BLE001 - a config that does not compile or fit: note it, go on
                    log(f"  {role} {config_tuple(c)}: {type(exc).__name__}: {str(exc)[:160]}")
                    continue
                timings.append({"pass": p, "role": role, "config": config_tuple(c), "us": round(us, 2)})
                log(f"  M={rows} pass {p} {role:<12} [{n:>6}, {k:>4}] {prologue:<5} {str(config_tuple(c)):<40} "
                    f"{us:8.1f} µs a step")
                if us < best_us:
                    best_us, configs = us, trial
        log(f"M={rows} after pass {p}: {best_us:.1f} µs a step")
    return configs, best_us, timings


def flag_set(text: str) -> dict:
    """``NAME=INT[,NAME=INT]`` -> {NAME: INT}, each NAME one of gemv_kernels' module switches."""
    flags = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if not hasattr(gemv_kernels, name) or not value.lstrip("-").isdigit():
            raise argparse.ArgumentTypeError(f"{item!r}: want NAME=INT with NAME a gemv_kernels switch")
        flags[name] = int(value)
    return flags


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=lambda v: [int(r) for r in v.split(",")], default=[1],
                        help=f"row counts (decode batch sizes), 1..{gemv_kernels.DOT_MAX_ROWS} (the GEMV's rule up to "
                             f"{gemv_kernels.GEMV_MAX_ROWS}), comma-separated")
    parser.add_argument("--passes", type=int, default=2, help="coordinate-descent passes per row count (0: none)")
    parser.add_argument("--dot", action="store_true", help="the descent also tries the tensor-core candidates")
    parser.add_argument("--roles", type=lambda v: v.split(","), default=None,
                        help=f"the roles the descent varies, comma-separated (default: all of {', '.join(ROLE_KINDS)})")
    parser.add_argument("--profile", action="store_true",
                        help="also the rule's and cuBLAS's chain per kernel (the profiler's critical path)")
    parser.add_argument("--flags", action="append", type=flag_set, default=[],
                        help="NAME=INT[,NAME=INT]: the rule again with these gemv_kernels switches (e.g. FULL_TILES=0)"
                             "; repeat for more sets")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("gemv_chain needs a CUDA device")
    if args.roles and not set(args.roles) <= set(ROLE_KINDS):
        raise SystemExit(f"--roles takes roles of {', '.join(ROLE_KINDS)}, got {', '.join(args.roles)}")
    if not all(1 <= r <= gemv_kernels.DOT_MAX_ROWS for r in args.rows):
        raise SystemExit(f"--rows takes row counts 1..{gemv_kernels.DOT_MAX_ROWS}")
    start_time = time.time()
    copy_gbps = copy_bandwidth_gbps()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {copy_gbps:.0f} GB/s", flush=True)
    chain = Chain(Shape())
    bound_us = chain.weight_bytes / (copy_gbps * 1e9) * 1e6
    print(f"97 matmuls, {chain.weight_bytes / 1e9:.3f} GB of weights: bound {bound_us:.1f} µs a step", flush=True)
    result = {"device": torch.cuda.get_device_name(), "copy_bandwidth_gbps": round(copy_gbps, 1),
              "weight_bytes": chain.weight_bytes, "bound_us": round(bound_us, 2), "rows": {}}
    args.out.mkdir(parents=True, exist_ok=True)
    log = lambda line: print(line, flush=True)  # noqa: E731
    for rows in args.rows:
        entry = {"compare": compare(chain, rows, bound_us, log, args.profile, args.flags)}
        if args.passes > 0:
            timed = {label: e for label, e in entry["compare"].items() if "_configs" in e}
            best = min(timed, key=lambda label: timed[label]["us"])  # the fastest skinny variant as the start
            configs, best_us, timings = descend(chain, rows, timed[best]["_configs"], args.passes, log, args.dot,
                                              args.roles)
            entry["best"] = {"configs": {role: config_tuple(c) for role, c in configs.items()}, "us": round(best_us, 2)}
            entry["timings"] = timings
            for role, c in entry["best"]["configs"].items():
                log(f"M={rows} best {role}: {c}")
        for e in entry["compare"].values():
            e.pop("_configs", None)
        result["rows"][rows] = entry
        result["wall_s"] = round(time.time() - start_time, 1)
        (args.out / "gemv_chain.json").write_text(json.dumps(result, indent=1))
    labels = ["rule", "cuBLAS", "rule, lm_head GEMV", "cuBLAS, lm_head dot", "dot"]
    labels[1:1] = [label for label in next(iter(result["rows"].values()))["compare"] if label.startswith("rule, ")
                   and label not in labels]
    print(f"\nµs a step (% of the {bound_us:.1f} µs bound)", flush=True)
    print(f"{'rows':>4}  " + "  ".join(f"{label:>16}" for label in labels) + f"  {'descent':>16}")
    for rows, entry in result["rows"].items():
        cells = []
        for label in labels + ["descent"]:
            got = entry.get("best") if label == "descent" else entry["compare"].get(label)
            cells.append(f"{got['us']:8.1f} ({bound_us / got['us']:5.1%})" if got and "us" in got else f"{'-':>16}")
        print(f"{rows:>4}  " + "  ".join(cells))
    print(f"wall {time.time() - start_time:.0f} s")


if __name__ == "__main__":
    main()
