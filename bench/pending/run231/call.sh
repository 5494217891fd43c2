#!/bin/bash
# #20's H200 cells on the tree as it stands (run163's command): the cookbook c1 / c16 and the sweep at batch 1-16 on
# one 16-slot engine, prefill first. On any other GPU it stops at once (the cells are the H200's).
RUN=run231 source bench/device_env.sh || exit 1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$GPU"
case "$GPU" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0 ;; esac
TAIL=30 step bench 570 python3 -m bench cookbook,sweep --model qwen3.5-0.8b --device cuda --dtype bfloat16 \
  --max-model-len 9216 --max-num-seqs 16 --no-mixed-steps -p cookbook.concurrency=1,16 -p sweep.batches=1,2,4,8,16 \
  --out $W/bench
