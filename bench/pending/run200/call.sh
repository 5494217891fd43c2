#!/bin/bash
# For an H200 (kind nvidia-h200, needs_h200; carry .whl): the served streams of run 199 on the GPU, with
# one-sequence capture (A) against the default's steps of several sequences (B). Predicted from the H100 (runs 197,
# 199): c = 16 ~2x the output tok/s and ITL p99 ~30-40 -> ~6 ms; c = 64 ~+15%, ITL p99 ~45 -> ~9 ms. The first
# process compiles cold (~150-250 s on an H100): give it the longest limit.
RUN=run200 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
A16="--model qwen3.5-0.8b --shapes 1x512+15,4x128+0 --serve 16 --requests 96 --input-len 512 --output-len 128"
A64="--model qwen3.5-0.8b --shapes 1x1024+63,8x128+0 --serve 64 --requests 256 --input-len 1024 --output-len 256"
TAIL=6 step c16_one_seq 280 python3 bench/prompt_steps.py $A16 --max-prefill-capture-seqs 1 --out $W/c16_one_seq
TAIL=6 step c16_several 120 python3 bench/prompt_steps.py $A16 --out $W/c16_several
TAIL=6 step c64_one_seq 200 python3 bench/prompt_steps.py $A64 --max-prefill-capture-seqs 1 --out $W/c64_one_seq
TAIL=6 step c64_several 150 python3 bench/prompt_steps.py $A64 --out $W/c64_several
