# python3 .wt/verify_rule.py OPS_JSON <bench args>: `python3 -m bench` with VERIFY_LAUNCHES set to the verify launch
# (whole heads or a V block) ops_microbench timed fastest at P = 3 at each measured batch (an experiment's override).
import json
import math
import runpy
import sys

import ops.triton.gated_deltanet_kernels as kernels

rows = json.load(open(sys.argv.pop(1)))["rows"]
best = {}
for r in sorted(rows, key=lambda r: r["us"]):
    op = r["op"].strip()
    if op == "gated_deltanet_verify P=3":
        best.setdefault(r["batch"], (None, 8))
    elif op.startswith("gated_deltanet_verify P=3 v"):
        best.setdefault(r["batch"], (r["extra"]["block_v"], r["extra"]["num_warps"]))
table = sorted(best.items())
kernels.VERIFY_LAUNCHES = tuple((b, *pick) for b, pick in table[:-1]) + ((math.inf, *table[-1][1]),)
print("VERIFY_LAUNCHES =", kernels.VERIFY_LAUNCHES, flush=True)
sys.argv[0] = "bench"
runpy.run_module("bench", run_name="__main__", alter_sys=True)
