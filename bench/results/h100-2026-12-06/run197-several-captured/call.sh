#!/bin/bash
# Captured steps of several sequences: their GPU tests, then bench/prompt_steps.py's shapes and a served stream
# (16 in flight, 512-token prompts, outputs of 64-192 tokens: each arrival a mixed step) with the engine capturing
# steps of one sequence only (A) and of up to 64 sequences (B, the default's limit at this max_num_seqs). Any GPU.
RUN=run197 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=15 step tests 200 python3 -m pytest -q -m gpu tests/test_prefill_graphs.py -p no:cacheprovider
ARGS="--model qwen3.5-0.8b --serve 16 --requests 96 --input-len 512 --output-len 128"
TAIL=12 step steps_one_seq 200 python3 bench/prompt_steps.py $ARGS --max-prefill-capture-seqs 1 --out $W/one_seq
TAIL=12 step steps_several 200 python3 bench/prompt_steps.py $ARGS --out $W/several
grep -h "captured" $W/steps_*.log
