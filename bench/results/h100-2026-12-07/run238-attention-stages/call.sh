#!/bin/bash
# Any GPU (~8 min): the decode attention's split kernel at 1-3 pipeline stages and 4 / 8 warps. Run 148 (H200, the
# full grid) had 1 x 8,192 at 11.1 µs with 1 stage against the rule's 12.2 (Triton's default, 3); the rule never
# changed. First the op alone (20 calls a graph, the rule's split count and key tile), then the decode graph at batches
# 1, 2, 4 and context 8,192 (9,216-wide tables) with the rule's stages and with 1 stage up to batch 4.
# Predicted: the op -0.5 to -1 µs at 1 x 8,192; the graph -3 to -6 µs a step at batch 1, level to -4 at 2 and 4.
RUN=${RUN_NAME:-run238} source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=60 step sweep 170 python3 bench/attention_decode_sweep.py --warps 4,8 --stages 1,2,3 \
  --cases 1x8192x9216,2x8192x9216,4x8192x9216,1x512x8300,4x512x8300,8x8192x9216 --out $W/sweep
PATHS=(python3 bench/step_paths.py --batches 1,2,4 --top 8 --context 8192 --max-model-len 9216)
TAIL=30 step paths_rule 210 "${PATHS[@]}" --out $W/paths_rule
TAIL=30 step paths_stages1 150 "${PATHS[@]}" --attention-stages 4:1 --out $W/paths_stages1
