#!/bin/bash
# Any GPU (~9.5 min cold). A mixed step's decode rows through the linear layers' decode kernels (mixed_decode_lanes
# 16, the new default; captured mixed keys of 16 decode lanes) against the chunked path (each decode row a one-token
# sequence in FLA's kernels, its state moved ~7 times). First the GPU tests of the captured prompt and mixed steps
# (run220's test, rewritten for mixed keys). Then one process (B, lanes 16, cold) times each shape with its decode
# rows first (lanes: the mixed key) and last (the chunked path in a key without lanes: what lanes 0 runs), and a
# served stream of 24 in flight; then A (lanes 0, warm) the same served stream.
# Predicted (H100; run 218: 1x256+15 5.46 ms against 4.19 for the prompt alone): 1x256+15 ~4.5 ms against ~5.5 rows
# last (-1 ms); +1 / +4 rows -0.1 / -0.3 ms; served c = 24 a few % more output tok/s, ITL p99 lower.
RUN=run221 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=30 step tests 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_prefill_graphs.py \
  -k "several_sequences_equal_eager_ones_on_gpu or captured_prompt_steps_equal_eager"
ARGS="--model qwen3.5-0.8b --serve 24 --requests 72 --input-len 512 --output-len 128 -v"
TAIL=16 step B_lanes16 270 python3 bench/prompt_steps.py $ARGS --shapes 1x256+1,1x256+4,1x256+15,1x1024+15,2x512+8 \
  --out $W/B_lanes16
TAIL=6 step A_lanes0_served 140 python3 bench/prompt_steps.py $ARGS --shapes '' --mixed-decode-lanes 0 --out $W/A_lanes0
