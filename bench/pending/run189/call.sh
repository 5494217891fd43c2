#!/bin/bash
# For an H200 (#23's table: k x acceptance x batch at batches 8 and 64). The last figures past batch 1 predate chained
# rounds (runs 67-73, 87, 153). Cold, one k at batch 8 took ~300 s on an H100 (run 193: cut at its 290-s limits with
# k = 1 at batch 8 done: forced 0.8 1.36x, forced 1 1.51x, the MTP head under the rule 1.16x). So this call runs
# k = 2 only (#23's k), batch 8 then batch 64; k = 1 and 3 need a call each (`-p spec.ks=1` / `3`), or `.cecache`.
# Predicted: batch 8 k = 2 forced 0.8 ~1.5-1.7x; batch 64 < 1 without the rule and ~0.95x with it.
RUN=${RUN_NAME:-run189} source bench/device_env.sh || exit 1
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-model-len 512
  -p spec.ks=2 -p spec.rates=0.8,1.0 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=2)
TAIL=16 step spec_b8 300 "${SPEC[@]}" --max-num-seqs 8 -p spec.batches=8 --out $W/spec_b8
TAIL=16 step spec_b64 280 "${SPEC[@]}" --max-num-seqs 64 -p spec.batches=64 --out $W/spec_b64
