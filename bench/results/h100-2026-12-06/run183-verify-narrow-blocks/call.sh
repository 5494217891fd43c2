#!/bin/bash
# Any GPU. The GDN verify at batch 1 in narrower V blocks: 4 warps over V blocks of 16 (128 programs) and 8 (256
# programs) against the rule's 32 (64 programs), the split norm in each. Offline (bench/sass_stats.py, Triton 3.9,
# sm_90a, P = 3): instructions a warp / SASS barriers / registers 2,128 / 69 / 164 (32:4), 1,712 / 63 / 122 (16:4),
# 1,488 / 45 / 95 (8:4). Run 182 charged the GDN verify 168 µs of the k = 2 round (9.3 µs a layer; decode ~5.5).
# Predicted: 8:4 -20 to -40 µs a round (fewer barriers and instructions on each warp's walk; the q / k conv and norms
# recomputed by 4x the programs are in those counts), 16:4 about half that.
# `bench spec` k = 2 forced 0.8 under each launch (VERIFY_LAUNCHES' first entry set by sed, A/B/C), the kernel's GPU
# tests with the new cases between B and C.
RUN=run183 source bench/device_env.sh || exit 1
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1
  --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10
  -p spec.draft_vocab_size=32768 -p spec.repeats=3)
K=ops/triton/gated_deltanet_kernels.py
grep -q "^VERIFY_LAUNCHES = ((2, 32, 4, True)," $K || { echo "VERIFY_LAUNCHES changed: fix the sed"; exit 1; }
TAIL=16 step spec_v32 200 "${SPEC[@]}" --out $W/spec_v32
sed -i 's/^VERIFY_LAUNCHES = ((2, 32, 4, True),/VERIFY_LAUNCHES = ((2, 8, 4, True),/' $K
TAIL=16 step spec_v8 140 "${SPEC[@]}" --out $W/spec_v8
TAIL=6 step tests 90 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "verify_in_v_blocks" -p no:cacheprovider
sed -i 's/^VERIFY_LAUNCHES = ((2, 8, 4, True),/VERIFY_LAUNCHES = ((2, 16, 4, True),/' $K
TAIL=16 step spec_v16 140 "${SPEC[@]}" --out $W/spec_v16
