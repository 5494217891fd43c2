#!/bin/bash
# (Run on an H100 in the thirty-ninth session as run193, the H200 starting none: the table on one GPU kind.)
# For an H200 (#23's table: k x acceptance x batch at batches 8 and 64, k = 1, 2, 3). The last figures past batch 1
# predate chained rounds (runs 67-73, 87, 153). `bench spec` at forced 0.8 and 1.0 with the drafting rule beside each;
# batch 8 first (where drafting paid in run 153: 1.66-1.76x by decode step, unchained), then batch 64 (run 87: 0.80x;
# the rule should turn drafting off there). Predicted: batch 8 k = 2 forced 0.8 ~1.5-1.7x, batch 64 < 1 without the
# rule and ~0.95x with it.
RUN=${RUN_NAME:-run189} source bench/device_env.sh || exit 1
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-model-len 512
  -p spec.ks=1,2,3 -p spec.rates=0.8,1.0 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=2)
TAIL=16 step spec_b8 290 "${SPEC[@]}" --max-num-seqs 8 -p spec.batches=8 --out $W/spec_b8
TAIL=16 step spec_b64 290 "${SPEC[@]}" --max-num-seqs 64 -p spec.batches=64 --out $W/spec_b64
