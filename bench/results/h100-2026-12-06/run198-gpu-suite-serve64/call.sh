#!/bin/bash
# After captured steps of several sequences: the whole GPU suite (the memory plan and every compiled engine now
# capture them), then a served stream at 64 in flight with 1,024-token prompts (each arrival's mixed step 1,087
# tokens in 64 sequences), one-sequence capture (A) against the default (B). Any GPU.
RUN=run198 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=25 step gpu_suite 300 python3 -m pytest -q -m gpu -n 6 -p no:cacheprovider --ignore=tests/test_server.py tests
ARGS="--model qwen3.5-0.8b --shapes 1x1024+63,8x128+0 --serve 64 --requests 256 --input-len 1024 --output-len 256"
TAIL=6 step serve64_one_seq 150 python3 bench/prompt_steps.py $ARGS --max-prefill-capture-seqs 1 --out $W/one_seq
TAIL=6 step serve64_several 150 python3 bench/prompt_steps.py $ARGS --out $W/several
grep -h "captured" $W/serve64_*.log
