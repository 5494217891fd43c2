#!/bin/bash
# For an H200 only (#20's cells are the H200's): run 142's cookbook c1 / c16 and the sweep at batch 1-16 on one
# 16-slot engine, prefill first. Since run 142 the tree has session 30's SiLU gate in gate_up's epilogue, FULL at one
# row, the early loads (run 173, H100: -3 to -8 µs a batch-1 decode graph) and, at 2-4 rows, nothing new (the skinny
# GEMM's 5-row ceiling touches no decode bucket). Predicted from the H100's chain (runs 156 and 160): c1 TPOT
# ~0.73 ms (run 142: 0.75), the sweep's b1 ~54-55% (53.7), b2-b4 +1 point. #23's batch-1 cells are run187's.
RUN=run163 source bench/device_env.sh || exit 1
TAIL=30 step bench 560 python3 -m bench cookbook,sweep --model qwen3.5-0.8b --device cuda --dtype bfloat16 \
  --max-model-len 9216 --max-num-seqs 16 --no-mixed-steps -p cookbook.concurrency=1,16 -p sweep.batches=1,2,4,8,16 \
  --out $W/bench
