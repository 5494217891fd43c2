"""The skinny GEMM (ops/triton/gemv_kernels.py) compiled for the H100/H200 (sm_90a) on a CPU machine, no GPU, as its
launcher would launch it on the model's weight shapes: per row count and role, the registers and spill bytes ptxas
reports and the instructions of the kernel's main loop (its longest backward branch, one K chunk an iteration), the
most frequent of them. A count is a lead, not a time: the word reads took 10% of the 2-row loop's instructions
and no time off it (bench/NOTES.md, "Runs 177-179"). Compiled with the JIT's specialisations: unit strides along K
and 16-divisible pointers, sizes and row strides (the model's shapes all are), so the loads vectorise as on the GPU.

    python bench/gemv_sass.py --rows 1,2,3,4                     # the tree's switches
    python bench/gemv_sass.py --rows 1 --flags FULL_TILES=0      # a gemv_kernels switch flipped (as gemv_chain.py's)
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gemv_chain import flag_set  # noqa: E402
from bench.sass_stats import ptxas_report_and_sass  # noqa: E402
from ops.triton import gemv_kernels as gk  # noqa: E402

# The model's weight shapes by role ([N, K], Qwen3.5-0.8B) and whether the launch writes the SiLU gate's output.
ROLES = {"out_proj": (1024, 2048, False), "down": (1024, 3584, False), "in_proj": (6144, 1024, False),
         "gate_up": (7168, 1024, True), "lm_head": (248320, 1024, False)}
SIG = dict(x="*bf16", weight="*bf16", out="*bf16", M="i32", N="i32", K="i32", stride_x_m="i32", stride_w_n="i32",
           stride_o_m="i32", residual="*bf16", norm_weight="*bf16", summed="*bf16", stride_r_m="i32", eps="fp32",
           prefetch_programs="i32")
DIVISIBLE = ["x", "weight", "out", "residual", "norm_weight", "summed", "N", "K", "stride_x_m", "stride_w_n",
             "stride_o_m"]


def compile_launch(rows: int, n: int, k: int, gated_out: bool):
    """The kernel as ``gemv_kernels._launch`` would launch it (plain x: no norm or gate prologue), and its config."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    config = gk.skinny_config(rows, n, k)
    tiles = gk.row_tiles(rows, config)
    constexprs = {key: v for key, v in config.kwargs.items() if key not in ("BLOCK_M", "DOT")}
    constexprs.update(tiles, FULL=gk.full_tiles(rows, n, k, config, tiles), GATED_X=False, NORM_X=False,
                      GATED_OUT=gated_out, NORM_BLOCK=1, USE_PDL=True, PREFETCH_L2=True, stride_x_k=1,
                      stride_w_k=1, stride_o_n=1)
    fn = gk._skinny_gemm_kernel
    names = fn.arg_names
    source = ASTSource(fn=fn, signature={name: "constexpr" if name in constexprs else SIG[name] for name in names},
                       constexprs={(names.index(key),): v for key, v in constexprs.items()},
                       attrs={(names.index(name),): [["tt.divisibility", 16]] for name in DIVISIBLE})
    options = {"num_warps": config.num_warps, "enable_fp_fusion": True}
    if config.maxnreg:
        options["maxnreg"] = config.maxnreg
    return triton.compile(source, target=GPUTarget("cuda", 90, 64), options=options), config, tiles


def loop_stats(kernel) -> dict:
    """Registers, spill bytes, and the longest loop's instruction count and mix (SASS from nvdisasm)."""
    report, sass = ptxas_report_and_sass(kernel)
    ops, labels = [], {}
    for line in sass.splitlines():
        if re.match(r"\s*\.L_x_\d+:", line):
            labels[line.strip()[:-1]] = len(ops)
        elif m := re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*)", line):
            ops.append((m.group(1).split(".")[0], m.group(2)))
    loop = (0, 0)  # (start, length) of the longest backward branch
    for i, (op, rest) in enumerate(ops):
        target = re.search(r"(\.L_x_\d+)", rest) if op == "BRA" else None
        if target and labels.get(target.group(1), i + 1) <= i and i + 1 - labels[target.group(1)] > loop[1]:
            loop = (labels[target.group(1)], i + 1 - labels[target.group(1)])
    mix = Counter(op for op, _ in ops[loop[0]:loop[0] + loop[1]])
    registers = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores", report)
    return {"registers": int(registers.group(1)) if registers else None,
            "spill_bytes": int(spills.group(1)) if spills else 0, "loop": loop[1], "mix": mix.most_common(6)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=lambda v: [int(r) for r in v.split(",")], default=[1, 2, 3, 4])
    parser.add_argument("--flags", type=flag_set, default={}, help="NAME=INT[,NAME=INT]: gemv_kernels switches")
    args = parser.parse_args(argv)
    for name, value in args.flags.items():
        setattr(gk, name, value)
    for rows in args.rows:
        for role, (n, k, gated_out) in ROLES.items():
            kernel, config, tiles = compile_launch(rows, n, k, gated_out)
            if tiles["DOT"]:
                continue  # the tensor-core loop: not the GEMV's
            kw = config.kwargs
            tile = f"{tiles['BLOCK_M']}{'+1' if tiles['EXTRA_ROW'] else ''}x{kw['BLOCK_N']}x{kw['BLOCK_K']}"
            got = loop_stats(kernel)
            print(f"rows {rows} {role:<8} {tile:<14} {config.num_warps}w: {got['registers']} registers, "
                  f"{got['spill_bytes']} B spilled, {got['loop']} loop instructions a chunk {got['mix']}", flush=True)


if __name__ == "__main__":
    main()
