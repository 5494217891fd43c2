#!/bin/bash
# Two commands on the H200 left warm by run192 (the session's last ~250 device-seconds), each its own device call:
RUN=run194 source bench/device_env.sh && TAIL=30 step cookbook_c1 215 python3 -m bench cookbook --model qwen3.5-0.8b \
  --device cuda --dtype bfloat16 --max-model-len 9216 --max-num-seqs 1 --no-mixed-steps -p cookbook.concurrency=1 \
  --out $W/bench
RUN=run194 source bench/device_env.sh && TAIL=20 step sweep 140 python3 -m bench sweep --model qwen3.5-0.8b \
  --device cuda --dtype bfloat16 --max-model-len 9216 --max-num-seqs 4 --no-mixed-steps -p sweep.batches=1,2,4 \
  --out $W/sweep
