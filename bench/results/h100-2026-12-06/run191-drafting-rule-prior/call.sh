#!/bin/bash
# Any GPU. (1) `bench spec` batch 1, k = 2, 3, 4, forced 0.8 and the MTP head under the drafting rule, after the rule's
# optimistic stop counts its prior in drafts (9d216e1): at acceptance 0 a fresh rule drafted ~16 rounds at every k
# (run 186 on an H100: 0.93x / 0.91x / 0.90x at k = 2 / 3 / 4). Predicted from the H100's costs replayed offline:
# ~9 / 7 / 6 rounds, so ~0.95x / ~0.96x / ~0.97x; forced 0.8 unchanged (1.56x / 1.68x / 1.73x).
# (2) run190: one descent pass of the 97-matmul chain at 5 rows with 4 + 1 x 8 tiles among the candidates
# (predicted -10 to -30 µs against the rule's 4 + 1 x 4), then ce::silu_mul_linear's 5-row GPU case.
RUN=run191 source bench/device_env.sh || exit 1
TAIL=16 step spec 330 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 \
  --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2,3,4 -p spec.rates=0.8 -p spec.step_iters=10 \
  -p spec.draft_vocab_size=32768 -p spec.repeats=2 --out $W/spec
TAIL=40 step chain5 150 python3 bench/gemv_chain.py --out $W/chain5 --rows 5 --passes 1
TAIL=6 step tests 60 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "silu_mul_linear_on_model_shapes" \
  -p no:cacheprovider
