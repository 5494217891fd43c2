# python3 .wt/fused.py N <bench args>: run `python3 -m bench` with FUSED_MAX_BATCH = N (an experiment's override)
import runpy
import sys

import ops.triton.gated_deltanet_kernels as kernels

kernels.FUSED_MAX_BATCH = int(sys.argv.pop(1))
print(f"FUSED_MAX_BATCH = {kernels.FUSED_MAX_BATCH}", flush=True)
sys.argv[0] = "bench"
runpy.run_module("bench", run_name="__main__", alter_sys=True)
