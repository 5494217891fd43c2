#!/bin/bash
# For an H200 (#23's cells are the H200's; the last H200 figures are run 149's: forced 0.8 1.36x before rounds
# chained, verify graph 1.31 decode graphs). `bench spec` batch 1, forced 0.8, k = 2, 3 and 4 (k = 4 with the
# skinny GEMM up to 5 rows since 95f756d). Predicted from the H100 (runs 182 and 186: 1.56x / 1.68x / 1.73x output
# tok/s, 1.65x / 1.77x / 1.82x by TPOT): a little lower on the H200, whose faster memory leaves a round's hops a
# larger share (run 149: 1.36x where the H100 then gave ~1.45x).
RUN=run187 source bench/device_env.sh || exit 1
TAIL=16 step spec 330 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 \
  --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2,3,4 -p spec.rates=0.8 -p spec.step_iters=10 \
  -p spec.draft_vocab_size=32768 -p spec.repeats=2 --out $W/spec
# Then the 5-row cases of the fused norm ops' GPU tests (added with 95f756d, not yet run on a GPU).
TAIL=6 step tests 60 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -p no:cacheprovider \
  -k "add_rms_norm_linear_on_model_shapes or add_rms_norm_linear_silu_mul_on_model_shapes"
