#!/bin/bash
# Any GPU (~6 min). The decode attention's empty splits (no cached key, not the new token's owner) store an empty
# partial and skip the query's norm and RoPE; the reduce kernel spreads each query head's channels over several
# programs at small batches (8 at batch 1, 64 programs instead of 8). attn.patch is the change: the GPU tests, then
# the op alone (20 calls a graph) with the change and without it (git apply -R); the decode graph is run233's.
# Predicted: the op alone at 1 x 8,192 -1 to -2 µs a call (the reduce), at 1 x 512 (55 of 64 splits empty) -1 to
# -2 µs; 128 splits with the split reduce within ~1 µs of 64 at 1 x 8,192 (run 139 lost 5 µs there with the
# one-program reduce); the graph -5 to -15 µs a step (run 139: 0.750 ms, attention 91.9 + reduce 22.4 µs).
RUN=${RUN_NAME:-run232} source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
P=bench/pending/run232/attn.patch
TAIL=8 step tests 150 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -p no:cacheprovider \
  -k "attention_decode or paged_attention_decode or paged_attention_verify"
TAIL=30 step sweep_new 110 python3 bench/attention_decode_sweep.py --cases 1x8192x9216,1x512x9216,2x8192x9216 \
  --splits 64,128 --reduce-parts 1,8 --out $W/sweep_new
TAIL=20 step sweep_new_b 70 python3 bench/attention_decode_sweep.py --cases 4x8192x9216,16x8192x9216 \
  --reduce-parts 1,2,4,8 --out $W/sweep_new_b
git apply -R $P && echo "attn.patch reverted"
TAIL=30 step sweep_old 100 python3 bench/attention_decode_sweep.py \
  --cases 1x8192x9216,1x512x9216,2x8192x9216,4x8192x9216,16x8192x9216 --splits 64,128 --out $W/sweep_old
git apply $P && echo "attn.patch applied"
