"""The GDN decode and verify kernels compiled for the H100/H200 (sm_90a) on a CPU machine, no GPU: per launch config,
the registers and spill bytes ptxas reports and the SASS instruction mix, barriers (``BAR``) and shuffles first.
At a small batch these kernels are latency-bound: each cross-warp reduction or layout change is a shared-memory
round trip behind a barrier, so the barrier count predicts more than the instruction count does (bench/NOTES.md, run
167). Every stride is a runtime i64 here (tests/test_kernels_compile_sm90.py's ``GDN_SIG``); launched, Triton
specialises the unit strides, so the GPU's code differs in its loads but not in its reductions.

    python bench/sass_stats.py   # the verify kernel at P = 3 and the decode kernel, at the rules' launches
    python bench/sass_stats.py --verify 32:4:split:3 --verify 16:1:split:3 --decode 32:4:split
    python bench/sass_stats.py --verify 16:1:split:3 --decode ""   # (an empty launch: none of that kernel)

A launch is ``BLOCK_V:WARPS[:split][:POSITIONS]`` (BLOCK_V 128: whole heads); ``--group`` the value heads a key head.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HEADS, DK, DV, WIDTH = 16, 128, 128, 4  # Qwen3.5-0.8B's linear layers


def _signature(fn, extra: dict) -> dict:
    sig = {name: "i64" if name.startswith("stride") else "*bf16" for name in fn.arg_names}
    sig.update({"A_log": "*fp32", "dt_bias": "*fp32", "recurrent_state": "*fp32", "state_slots": "*i32",
                "counters": "*i32", "scale": "fp32", "eps": "fp32"}, **extra)
    return sig


def compile_sm90(fn, constexprs: dict, num_warps: int, extra_sig: dict | None = None, num_stages: int | None = None):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    sig = _signature(fn, extra_sig or {})
    full = {name: "constexpr" if name in constexprs else sig[name] for name in names}
    source = ASTSource(fn=fn, signature=full, constexprs={(names.index(k),): v for k, v in constexprs.items()})
    options = {"num_warps": num_warps, "enable_fp_fusion": True}  # (the JIT's default)
    if num_stages is not None:  # else Triton's default, as a launch without it
        options["num_stages"] = num_stages
    return triton.compile(source, target=GPUTarget("cuda", 90, 64), options=options)


def ptxas_report_and_sass(kernel) -> tuple[str, str]:
    """ptxas's verbose report (registers, spills) for sm_90a and nvdisasm's SASS of a compiled Triton kernel."""
    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path
    report = subprocess.run([ptxas, "-arch=sm_90a", "-v", "-o", os.devnull, "-"], input=kernel.asm["ptx"],
                            capture_output=True, text=True).stderr
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        sass = subprocess.run([os.path.join(os.path.dirname(ptxas), "nvdisasm"), "-c", cubin.name],
                              capture_output=True, text=True).stdout
    return report, sass


def stats(kernel) -> dict:
    report, sass = ptxas_report_and_sass(kernel)
    registers = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores", report)
    ops = Counter(m.group(2).split(".")[0] for line in sass.splitlines()
                  if (m := re.search(r"/\*[0-9a-f]{4}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)))
    return {"registers": int(registers.group(1)) if registers else None,
            "spill_bytes": int(spills.group(1)) if spills else None,
            "instructions": sum(ops.values()), "BAR": ops["BAR"], "SHFL": ops["SHFL"], "top": ops.most_common(6)}


def _launch(text: str, positions: bool) -> tuple[int, int, bool, int]:
    parts = text.split(":")
    block_v, warps = int(parts[0]), int(parts[1])
    split = "split" in parts[2:]
    numbers = [int(p) for p in parts[2:] if p.isdigit()]
    return block_v, warps, split, (numbers[0] if numbers else 3) if positions else 1


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verify", action="append", default=None, help="BLOCK_V:WARPS[:split][:POSITIONS]")
    parser.add_argument("--decode", action="append", default=None, help="BLOCK_V:WARPS[:split]")
    parser.add_argument("--group", type=int, default=1, help="value heads a key head (G)")
    args = parser.parse_args(argv)
    from ops.triton import gated_deltanet_kernels as gk

    verify = [t for t in args.verify if t] if args.verify is not None else ["32:4:split:3", "128:8:3", "64:4:3"]
    decode = [t for t in args.decode if t] if args.decode is not None else ["32:4:split", "128:8", "32:4"]
    common = dict(NUM_K_HEADS=HEADS, NUM_V_HEADS=HEADS * args.group, GROUP=args.group, DK=DK, DV=DV, WIDTH=WIDTH,
                  BLOCK_K=DK, ROUND_WEIGHT_PRODUCT=True, USE_PDL=True, BLOCK_HEAD=DV)
    for text in verify:
        block_v, warps, split, positions = _launch(text, True)
        kernel = compile_sm90(gk._gated_deltanet_verify_kernel,
                              dict(common, POSITIONS=positions, WIDTH_P=WIDTH, BLOCK_V=block_v, V_BLOCKS=DV // block_v,
                                   SPLIT_NORM=split), warps, {"history": "*fp32", "out": "*bf16"})
        print(f"verify {text:>14} G={args.group}: {stats(kernel)}", flush=True)
    for text in decode:
        block_v, warps, split, _ = _launch(text, False)
        kernel = compile_sm90(gk._gated_deltanet_decode_kernel,
                              dict(common, HIST_P=WIDTH, BLOCK_V=block_v, V_BLOCKS=DV // block_v,
                                   WALK_BLOCKS=1 if split else DV // block_v, SPLIT_V=split, PREFETCH=not split),
                              warps)
        print(f"decode {text:>14} G={args.group}: {stats(kernel)}", flush=True)


if __name__ == "__main__":
    main()
