#!/bin/bash
# An H200 (~8 min; after run231 on the same warm machine). #23's three batch-1 cells on the current tree (the last
# H200 figures are run 195's, before the attention's reduce split and stage rule): `bench spec` batch 1, k = 2,
# forced 0.8, the MTP head under the drafting rule (acceptance 0 with random weights). Predicted from the H100 (run
# 239: 1.55x, verify 1.26 decode graphs): ~1.50x and ~1.30 here (run 195: 1.489x, 1.33). Then FLA's configs for
# the H200 (bench/fla_configs.py; ~100 s cold), whose folder lands in ops/triton/fla_kernel_configs/.
RUN=${RUN_NAME:-run242} source bench/device_env.sh || exit 1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$GPU"
case "$GPU" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0 ;; esac
TAIL=24 step spec 300 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 \
  --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10 \
  -p spec.draft_vocab_size=32768 -p spec.repeats=2 --out $W/spec
TAIL=12 step fla_configs 200 python3 bench/fla_configs.py --model qwen3.5-0.8b --max-num-seqs 64 \
  --max-model-len 9216 --out $W/fla_kernel_configs
