"""One decoder layer's matmuls (bench/gemv_chain.py's chain), run eagerly between ``cudaProfilerStart`` and
``cudaProfilerStop`` so that Nsight Compute profiles exactly those kernels: where a skinny GEMM call's time goes (DRAM
throughput, issue slots, warp stalls, instructions executed) at a given row count.

    ncu --clock-control none --profile-from-start off --section SpeedOfLight --section WarpStateStats \\
        --section InstructionStats --section Occupancy --section LaunchStats --csv --page details \\
        python3 bench/gemv_ncu.py --rows 4 [--cublas]

The layer is a Gated-DeltaNet layer (in_proj and gate_up with the norm prologue, gate_up with the SiLU gate in its
epilogue, out_proj, down; with ``--dot`` the gate in down's prologue, as the tensor-core loop has no epilogue),
then the lm_head; warm-up runs of the same calls come first, outside the profiled range (the compiles). Every kernel
runs alone under ncu (its replays flush the caches), without the PDL overlap of a step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gemv_chain import Chain, dot_configs  # noqa: E402
from bench.ops_microbench import Shape  # noqa: E402


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--cublas", action="store_true", help="ce::linear's cuBLAS path instead of the skinny GEMM")
    parser.add_argument("--dot", action="store_true",
                        help="every role on the tensor-core loop (gemv_chain's tensor-core start)")
    args = parser.parse_args(argv)
    shape = Shape()
    shape.layers = 1  # the first layer, a Gated-DeltaNet one (full attention comes every fourth)
    chain = Chain(shape)
    chain.set_rows(args.rows)
    mode = "cublas" if args.cublas else "skinny_down_prologue" if args.dot else "skinny"
    configs = dot_configs(chain.roles) if args.dot else None
    for _ in range(3):  # compile and warm
        chain.run(configs, mode)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    chain.run(configs, mode)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled one GDN layer's matmuls and the lm_head at {args.rows} rows ({'dot' if args.dot else mode})")


if __name__ == "__main__":
    main()
