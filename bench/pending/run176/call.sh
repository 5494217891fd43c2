#!/bin/bash
# Any GPU. The few-rows GEMV reading bf16 x and weights as int32 words of two values (gemv_kernels.READ_WORDS: one
# shift or mask a value to fp32 where the bf16 reads take a PRMT and a shift; ptxas for sm_90 offline, the loop at
# 2 rows 335 -> 301 instructions, 3 rows 435 -> 393) and the GEMV loops unrolled twice at tiles of 1-2 rows
# (GEMV_UNROLL: no MOVs of the look-ahead's registers; with the words, 2 rows 263 and 3 rows 345 a chunk). (1) their
# GPU tests (words and unroll change no bit; every linear test); (2) the 97-matmul chain at 1-4 rows: the rule (both
# on) against each switch off, both off (the tree before), and the unroll at 4-row tiles too (spills offline).
# Predicted: 1 row level to -10 µs (the unroll only), 2-3 rows -15 to -50 µs, 4 rows level or worse (spills).
# (3) `bench spec` batch 1, k = 2, forced 0.8 with both on, then both off: the verify's 3-row step; predicted the
# round graph -15 to -40 µs.
RUN=run176 source bench/device_env.sh || exit 1
TAIL=6 step tests 150 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -p no:cacheprovider \
  -k "linear or skinny or gemv or words"
TAIL=45 step chain 170 python3 bench/gemv_chain.py --out $W/chain --rows 1,2,3,4 --passes 0 --flags READ_WORDS=0 \
  --flags GEMV_UNROLL=1 --flags READ_WORDS=0,GEMV_UNROLL=1 --flags GEMV_UNROLL_MAX_TILE_ROWS=4
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=3)
TAIL=16 step spec_words 150 "${SPEC[@]}" --out $W/spec_words
sed -i 's/^READ_WORDS = True/READ_WORDS = False/; s/^GEMV_UNROLL = 2/GEMV_UNROLL = 1/' ops/triton/gemv_kernels.py
grep -n "^READ_WORDS\|^GEMV_UNROLL =" ops/triton/gemv_kernels.py
TAIL=16 step spec_bf16 110 "${SPEC[@]}" --out $W/spec_bf16
export_caches
