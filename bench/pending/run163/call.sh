#!/bin/bash
# For an H200 only (#20's and #23's cells are the H200's). `bench spec` at batch 1, k = 2 first (#23's headline cell:
# chained forced rounds since session 32, and since run 169 chained rounds that no longer wait on the host: predicted
# forced 0.8 ~1.65-1.7x, the H100's 1.627x; verify graph ~880-900 µs against run 149's 912.2, 1.31 decode graphs),
# then run 142's cookbook + sweep on the tree with session 30's SiLU gate in gate_up's epilogue and FULL at one row.
# Predicted from the H100's chain (runs 156 and 160): c1 TPOT ~0.73 ms (run 142: 0.75), the sweep's b1 ~54-55%
# (53.7), b2-b4 +1 point. Since session 34 the tree also has the early loads (run 173, H100: -3 to -8 µs a batch-1
# decode graph), and bench spec times each configuration 3 times (its median: run 170's and 173's single baselines
# were outliers). Its spec step now also reports the verify compiled as a round runs it (run 174, H100: 1.241 decode
# graphs against the eager graph's 1.268; run 179, H100: 1.218 with the verify attention unfused, which stays):
# predicted on this GPU ~1.20-1.24 against run 149's eager 1.31, forced 0.8 ~1.62-1.7x. The kernels' GPU tests ran
# on an H100 in runs 177-178; the steps' limits fit one 600-s call with the tar after each.
RUN=run163 source bench/device_env.sh || exit 1
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2,3 -p spec.rates=0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=3)
TAIL=12 step spec 240 "${SPEC[@]}" --out $W/spec
TAIL=30 step bench 330 python3 -m bench cookbook,sweep --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-model-len 9216 \
  --max-num-seqs 16 --no-mixed-steps -p cookbook.concurrency=1,16 -p sweep.batches=1,2,4,8,16 --out $W/bench
