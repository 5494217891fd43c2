#!/bin/bash
# Any GPU (~9 min). (1) A cold process's first prompt step of many sequences took 1.5-1.7 s against ~50 ms warm
# (runs 221-222: 12 or 24 prompts of 512 tokens in one eager step, in the machine's first process). Which kernel
# variants compile there, on an empty Triton cache: bench/cold_steps.py lists them per burst. Predicted: a variant of
# the FLA or conv kernels by sequence count or chunk count that the memory plan's start-up steps never meet.
# (2) #20's c16 cell with mixed steps (decode rows in lanes since session 46) against prefill first (run 142's mode).
RUN=run223 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
export TRITON_CACHE_DIR=/tmp/ce_triton_cold  # empty: no .cecache carried
TAIL=80 step cold 250 python3 bench/cold_steps.py --model qwen3.5-0.8b --out $W/cold
COOK="python3 -m bench cookbook --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-model-len 9216
  --max-num-seqs 16 -p cookbook.concurrency=16"
TAIL=25 step c16_mixed 140 $COOK --out $W/c16_mixed
TAIL=25 step c16_prefill_first 140 $COOK --no-mixed-steps --out $W/c16_prefill_first
