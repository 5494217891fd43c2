#!/bin/bash
# Any GPU but an H200 (~8 min; bench/pending/any_gpu.sh runs run231 on an H200 instead): #20's cookbook c1 / c16 and the
# sweep at batch 1-16 on one 16-slot engine (run231's command), for this GPU's figures on the current tree. The last
# H100 ones are run 165's (69540ef, 2026-12-05: c1 TPOT 0.90 ms, c16 2.19 ms, sweep b8 45.7 / 56.4%); since then the
# split GDN decode at 9-16 sequences, the attention's reduce split and its stage rule, FLA's recorded configs.
# Predicted: c1 TPOT ~0.85 ms (the batch-1 graph at context 8,192: 0.849 ms in run 238), c16 ~2.1 ms.
RUN=${RUN_NAME:-run243} source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=30 step bench 570 python3 -m bench cookbook,sweep --model qwen3.5-0.8b --device cuda --dtype bfloat16 \
  --max-model-len 9216 --max-num-seqs 16 --no-mixed-steps -p cookbook.concurrency=1,16 -p sweep.batches=1,2,4,8,16 \
  --out $W/bench
