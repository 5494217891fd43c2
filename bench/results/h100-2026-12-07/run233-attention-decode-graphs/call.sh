#!/bin/bash
# Any GPU, right after run232 on its warm machine (~10 min, cut at the call's 600 s): the batch-1 decode graph with
# attn.patch (run232's change) and without it (reverted here) at context 8,192 (9,216-wide tables), then the same at
# context 512 (tables 8,300 wide, the sweep engine's: 55 of 64 splits empty at batch 1), then the change at a split
# ceiling of 128. Predicted: -5 to -15 µs a step at 8,192; -5 to -10 at 512 (the empty splits' prologue).
RUN=${RUN_NAME:-run233} source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
P=bench/pending/run232/attn.patch
PATHS=(python3 bench/step_paths.py --batches 1 --top 8)
TAIL=16 step paths_new 170 "${PATHS[@]}" --context 8192 --max-model-len 9216 --out $W/paths_new
git apply -R $P && echo "attn.patch reverted"
TAIL=16 step paths_old 130 "${PATHS[@]}" --context 8192 --max-model-len 9216 --out $W/paths_old
TAIL=16 step paths_old_512 100 "${PATHS[@]}" --context 512 --max-model-len 8300 --out $W/paths_old_512
git apply $P && echo "attn.patch applied"
TAIL=16 step paths_new_512 100 "${PATHS[@]}" --context 512 --max-model-len 8300 --out $W/paths_new_512
TAIL=16 step paths_new_s128 90 "${PATHS[@]}" --context 8192 --max-model-len 9216 --max-splits 128 \
  --out $W/paths_new_s128
