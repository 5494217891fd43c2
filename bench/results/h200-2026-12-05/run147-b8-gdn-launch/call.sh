#!/bin/bash
# Prepared in session 26 (no device lent), not run yet. Run from the repository root; when it has run, move this
# folder under bench/results/ with its results.
# The batch-8 decode graph at context 8,192: the GDN decode rule's 5-8 entry (whole heads, 8 warps) against walked V
# tiles of 32 at 4 warps with the prefetch, the 9-16 entry since run 140 (one call a graph level at 8 sequences,
# 13.73 against 13.76 µs, run 134; at 16 the graph gained 31 µs where the op alone gained 1.4 µs a layer).
RUN=run147 source bench/device_env.sh || exit 1
TAIL=20 step paths_b8_rule 200 python3 bench/step_paths.py --batches 8 --context 8192 --max-model-len 9216 --top 8 --out $W/paths_b8_rule
TAIL=20 step paths_b8_v32 200 python3 bench/step_paths.py --batches 8 --context 8192 --max-model-len 9216 --top 8 --gdn-launch 32:4:1 --out $W/paths_b8_v32
