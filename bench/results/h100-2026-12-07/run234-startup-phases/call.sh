#!/bin/bash
# Run 234 (H100, warm machine after run 233): bench startup's phases on a 64-slot engine, cold (empty caches) and warm.
RUN=run234 source bench/device_env.sh && TAIL=12 step startup 560 python3 -m bench startup --model qwen3.5-0.8b \
  --device cuda --dtype bfloat16 --max-num-seqs 64 --max-model-len 9216 -p startup.total_timeout_s=540 --out $W/startup
