#!/bin/bash
# Prepared in session 26 (no device lent), not run yet. Run from the repository root; when it has run, move this
# folder under bench/results/ with its results.
# ce::attention_decode's full grid (splits around the rule's, key tiles of 32 / 64, 4 / 8 warps, 1-3 stages) at
# batch 1 and 16, context 8,192, 9,216-wide tables: 8 warps never timed at these cases. Offline (Triton 3.9, sm_90)
# the kernel spills 1,280 bytes a thread at 4 warps with the early loads, 592 at 8. The rule's figures: run 139,
# 1x8192 12.2 µs; run 144, 16x8192 73.5-74.4 µs.
RUN=run148 source bench/device_env.sh || exit 1
TAIL=60 step sweep 420 python3 bench/attention_decode_sweep.py --cases 1x8192x9216,16x8192x9216 --out $W/sweep
