# python3 .wt/conv_rule.py SWEEP_JSON <bench args>: `python3 -m bench` with the conv decode config of the sweep's
# fastest exact candidate at the smallest swept batch >= the launch's batch (an experiment's override).
import json
import runpy
import sys

import ops.triton.conv1d_kernels as kernels

results = json.load(open(sys.argv.pop(1)))["results"]
best = {}
for r in sorted(results, key=lambda r: r["us"]):
    if r["exact"]:
        best.setdefault(r["batch"], (r["config"]["block_c"], r["config"]["num_warps"]))
table = sorted(best.items())
print("conv decode configs by batch:", table, flush=True)


def decode_config(batch, num_channels):
    for b, config in table:
        if batch <= b:
            return config
    return table[-1][1]


kernels.decode_config = decode_config
sys.argv[0] = "bench"
runpy.run_module("bench", run_name="__main__", alter_sys=True)
