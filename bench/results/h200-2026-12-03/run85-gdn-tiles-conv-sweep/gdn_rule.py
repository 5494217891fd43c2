# python3 .wt/gdn_rule.py OPS_JSON <bench args>: `python3 -m bench` with the fused GDN decode kernel in V tiles above
# FUSED_MAX_BATCH instead of the unfused kernels, at the tile (block_v, warps) ops_microbench timed fastest at the
# smallest measured batch >= the launch's (an experiment's override).
import json
import runpy
import sys

import ops.triton.gated_deltanet_kernels as kernels

rows = json.load(open(sys.argv.pop(1)))["rows"]
best = {}
for r in sorted(rows, key=lambda r: r["us"]):
    if r["op"].strip().startswith("gated_deltanet_decode v"):
        best.setdefault(r["batch"], (r["extra"]["block_v"], r["extra"]["num_warps"]))
table = sorted(best.items())
print("GDN decode above", kernels.FUSED_MAX_BATCH, "rows, fused in V tiles (block_v, warps) by batch:", table,
      flush=True)


def decode_config(batch):
    if batch <= kernels.FUSED_MAX_BATCH:
        return True, None, 8
    for b, (block_v, warps) in table:
        if batch <= b:
            return True, block_v, warps
    return True, *table[-1][1]


kernels.decode_config = decode_config
sys.argv[0] = "bench"
runpy.run_module("bench", run_name="__main__", alter_sys=True)
