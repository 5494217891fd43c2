#!/bin/bash
# run222: right after run221 on the same machine (warm caches): A (mixed_decode_lanes 0) then B (16) again.
RUN=run222 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
ARGS="--model qwen3.5-0.8b --shapes 1x256+1,1x256+4,1x256+15,1x1024+15,2x512+8,1x256+17 --serve 24 --requests 72"
ARGS="$ARGS --input-len 512 --output-len 128 -v"
TAIL=16 step A_lanes0 270 python3 bench/prompt_steps.py $ARGS --mixed-decode-lanes 0 --out $W/A_lanes0
TAIL=16 step B_lanes16 270 python3 bench/prompt_steps.py $ARGS --out $W/B_lanes16
