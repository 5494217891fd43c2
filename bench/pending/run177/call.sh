#!/bin/bash
# Any GPU; run175 and run176 (never run: no machine started) in one call. Three changes never run on a GPU:
# (a) the verify step's attention fused (`fused.patch`: ce::attention_decode over R = k + 1 rows a sequence, each row
#     a query of the decode kernel, the step's new tokens folded in from registers), on top of the verify attention's
#     gate in its kernels (the tree without fused.patch). Predicted: the round graph -25 to -35 µs (run 174: ~12.3 µs
#     a verify attention layer between qkv and o_proj, 7 a round, against ~9.5 for the fused one-row decode).
# (b) the few-rows GEMV reading bf16 x and weights as int32 words (gemv_kernels.READ_WORDS: ptxas for sm_90 offline,
#     the loop at 2 rows 335 -> 301 instructions, 3 rows 435 -> 393) and the GEMV loops unrolled twice at tiles of
#     1-2 rows (GEMV_UNROLL: no MOVs of the look-ahead's registers; with the words, 2 rows 263 and 3 rows 345 a
#     chunk). Predicted in the 97-matmul chain: 1 row level to -10 µs, 2-3 rows -15 to -50 µs, 4 rows level.
# (c) off by default, in the chain only: at one row, x's chunk loaded in the weight chunk's shape where the warps
#     split N (gemv_kernels.GEMV_X_TILE: the wide configs; offline, 8 barriers and the shared-memory round trips of
#     x a loop iteration gone, 120 -> 142 instructions). Predicted: level to -15 µs at one row.
# (b) and (c) are off in the tree (READ_WORDS = False, GEMV_UNROLL = 1, GEMV_X_TILE = False) until measured.
# (1) the GPU tests of all three (each switch both ways); (2) the chain at 1-4 rows: the rule (the tree: all off)
# against words and unroll on, each alone, and GEMV_X_TILE; (3) `bench spec` batch 1, k = 2, forced 0.8 with words
# and unroll on (sed), then without fused.patch (`git apply -R`). Predicted: the round graph -40 to -70 µs against
# run 174's 1,172.4 (words, unroll and fused), +25 to +35 without fused.patch.
RUN=run177 source bench/device_env.sh || exit 1
P=bench/pending/run177/fused.patch
git apply -R --check $P || { echo "the tree does not carry fused.patch"; exit 1; }
TAIL=8 step tests 140 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -p no:cacheprovider \
  -k "attention_decode or paged_attention_verify or opcheck or linear or skinny or gemv or words"
TAIL=40 step chain 120 python3 bench/gemv_chain.py --out $W/chain --rows 1,2,3,4 --passes 0 \
  --flags READ_WORDS=1,GEMV_UNROLL=2 --flags READ_WORDS=1 --flags GEMV_UNROLL=2 --flags GEMV_X_TILE=1
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=3)
sed -i 's/^READ_WORDS = False/READ_WORDS = True/; s/^GEMV_UNROLL = 1$/GEMV_UNROLL = 2/' ops/triton/gemv_kernels.py
grep -n "^READ_WORDS\|^GEMV_UNROLL =" ops/triton/gemv_kernels.py
TAIL=16 step spec_all 140 "${SPEC[@]}" --out $W/spec_all
git apply -R $P && echo "fused.patch reversed"
TAIL=16 step spec_gate 100 "${SPEC[@]}" --out $W/spec_gate
export_caches
