#!/bin/bash
# Run as run165 with SPEC_BEFORE=0 (the cookbook and sweep only) on kind nvidia-h200, which the device tool filled with an H100.
# For an H200 only (#20's and #23's cells are the H200's): run 142's cookbook + sweep and `bench spec` at batch 1,
# k = 2, on the tree with session 30's SiLU gate in gate_up's epilogue and FULL at one row (masked few-rows loop).
# Predicted from the H100's chain (runs 156 and 160): c1 TPOT ~0.73 ms (run 142: 0.75; the one-row chain -18 µs
# from FULL, -2 to -8 from the epilogue), the sweep's b1 ~54-55% (53.7), b2-b4 +1 point; the verify graph ~880-900 µs
# (run 149: 912.2, 1.31 decode graphs; the 3-row epilogue -15 µs).
RUN=run163 source bench/device_env.sh || exit 1
TAIL=30 step bench 420 python3 -m bench cookbook,sweep --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-model-len 9216 \
  --max-num-seqs 16 --no-mixed-steps -p cookbook.concurrency=1,16 -p sweep.batches=1,2,4,8,16 --out $W/bench
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=1)
# The spec step only where the call has 150 s left of its 600 (a call may be given less: the session's device time).
[ $(( $(date +%s) - T0 )) -lt "${SPEC_BEFORE:-440}" ] && TAIL=10 step spec 150 "${SPEC[@]}" --out $W/spec
