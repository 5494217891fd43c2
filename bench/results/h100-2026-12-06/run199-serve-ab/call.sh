#!/bin/bash
# Captured steps of several sequences, buckets now up to twice max_model_len: the capture's GPU tests, then served
# streams with one-sequence capture (A) against the default (B): 64 in flight with 1,024-token prompts (each
# arrival's mixed step 1,087 tokens in 64 sequences: bucket 2,048 now), 16 in flight with 512-token prompts (run
# 197's cell). Each process prints its engine's build time and captured keys. Any GPU.
RUN=run199 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=5 step tests 150 python3 -m pytest -q -m gpu tests/test_prefill_graphs.py -p no:cacheprovider
A64="--model qwen3.5-0.8b --shapes 1x1024+63,8x128+0 --serve 64 --requests 256 --input-len 1024 --output-len 256"
A16="--model qwen3.5-0.8b --shapes 1x512+15 --serve 16 --requests 96 --input-len 512 --output-len 128"
TAIL=6 step c64_one_seq 200 python3 bench/prompt_steps.py $A64 --max-prefill-capture-seqs 1 --out $W/c64_one_seq
TAIL=6 step c64_several 150 python3 bench/prompt_steps.py $A64 --out $W/c64_several
TAIL=6 step c16_one_seq 120 python3 bench/prompt_steps.py $A16 --max-prefill-capture-seqs 1 --out $W/c16_one_seq
TAIL=6 step c16_several 120 python3 bench/prompt_steps.py $A16 --out $W/c16_several
