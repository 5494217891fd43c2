#!/bin/bash
# Any GPU (run 185's machine, warm). `bench spec` batch 1, k = 4, forced 0.8: the verify's 5-row matmuls on the
# few-rows GEMV (SKINNY_MAX_ROWS 5, the tree) against cuBLAS (4, by sed). Predicted from run 184's chain (873 against
# 1,000 µs at 5 rows): the verify graph ~-110 µs, the round ~-120 µs (the MTP pass over 5 rows too).
RUN=run186 source bench/device_env.sh || exit 1
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1
  --max-model-len 512 -p spec.batches=1 -p spec.ks=4 -p spec.rates=0.8 -p spec.step_iters=10
  -p spec.draft_vocab_size=32768 -p spec.repeats=2)
TAIL=8 step spec_rows5 200 "${SPEC[@]}" --out $W/spec_rows5
sed -i 's/^SKINNY_MAX_ROWS = 5$/SKINNY_MAX_ROWS = 4/' ops/linear.py && grep -q "^SKINNY_MAX_ROWS = 4$" ops/linear.py || exit 1
TAIL=8 step spec_rows4 200 "${SPEC[@]}" --out $W/spec_rows4
