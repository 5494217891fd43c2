#!/bin/bash
# Prepared in session 26 (no device lent), not run yet. Run from the repository root with nothing applied; when it
# has run, move this folder under bench/results/ with its results.
#  - ce::attention_decode's full grid (splits around the rule's, key tiles of 32 / 64, 4 / 8 warps, 1-3 stages) at
#    batch 1 and 16, context 8,192, 9,216-wide tables: 8 warps never timed at these cases. The rule's figures: run
#    139, 1x8192 12.2 µs; run 144, 16x8192 73.5-74.4 µs.
#  - early2.patch: EARLY_LOADS as a count of key tiles read before the PDL wait (0, 1, 2; the rule keeps 1 up to 4
#    sequences). At batch 1 and context 8,192 a split is two 64-token tiles, so with two both are in flight before
#    qkv_proj's output is read: one DRAM round trip a split instead of two. Offline (Triton 3.9, sm_90, the GPU's
#    stride specialisations): 4 warps 219 registers with one early tile, 255 with two; 8 warps 143 / 194; no local
#    memory in any; all 32 of the two tiles' 16-byte loads a thread issued before the wait at 8 warps. The sweep's
#    `--early-loads` times 0 / 1 / 2 tiles at 4 warps and 1 / 2 at 8 (each checked against the default's output).
#    Predicted: -1 to -1.5 µs a call at 1x8192 with two tiles (alone, where the wait is on the previous call's
#    reduce kernel, not qkv_proj: the graph's gain is what `step_paths.py --batches 1` would then say).
RUN=run148 source bench/device_env.sh || exit 1
P=bench/pending/run148
TAIL=60 step sweep 380 python3 bench/attention_decode_sweep.py --cases 1x8192x9216,16x8192x9216 --out $W/sweep
git apply $P/early2.patch || exit 1
TAIL=20 step early 120 python3 bench/attention_decode_sweep.py --cases 1x8192x9216,2x8192x9216,4x8192x9216 --early-loads --out $W/early
