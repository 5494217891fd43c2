#!/bin/bash
# For an H200 (#23's headline cells are the H200's; the last H200 figures, run 149's, predate chained rounds).
# (1) `bench spec` batch 1, forced 0.8, k = 2, 3, 4 and the MTP head under the drafting rule (9d216e1). Predicted from
# the H100 (run 191: 1.61x / 1.66x / 1.70x output tok/s; the rule at acceptance 0 0.96-0.98x): a little lower on the
# H200, whose faster memory leaves a round's hops a larger share (run 149: 1.36x where the H100 then gave ~1.45x).
# (2), the chain at 16 and 8 rows without a workspace, ran on an H100 (run 192: level) and left this call.
RUN=run192 source bench/device_env.sh || exit 1
TAIL=16 step spec 330 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 \
  --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2,3,4 -p spec.rates=0.8 -p spec.step_iters=10 \
  -p spec.draft_vocab_size=32768 -p spec.repeats=2 --out $W/spec
