#!/bin/bash
# An H200 (~9 min, the steps in order of what they settle; each step's results come back if a later one is cut):
# 1. #20's cells on the current tree (run231's command): the cookbook c1 / c16 and the sweep at batch 1-16 on one
#    16-slot engine, prefill first. The last H200 figures are runs 194 (c1 TPOT 0.73 ms) and 142 (c16 1.79 ms); since
#    then the attention's reduce split, its stage rule and the split ceiling at 128 (H100: -13, -9 and -12 to -17 µs
#    a batch-1 step at c1's contexts). Predicted c1 TPOT ~0.70 ms, c16 ~1.78.
# 2. #23's batch-1 cells (run242's): `bench spec` batch 1, k = 2, forced 0.8, two repeats. Run 195: 1.489x, verify
#    1.33 decode graphs; predicted from the H100 (run 239: 1.55x, 1.26) ~1.50x and ~1.30.
# 3. ce::attention_decode's GPU tests, the split ceiling's included (never run on a GPU yet).
# 4. FLA's prefill configs for the H200 (bench/fla_configs.py), to file under ops/triton/fla_kernel_configs/.
# On any other GPU it stops at once: bench/pending/any_gpu.sh runs the other call there.
RUN=${RUN_NAME:-run246} source bench/device_env.sh || exit 1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$GPU"
case "$GPU" in *H200*) ;; *) echo "not an H200: nothing run"; exit 0 ;; esac
TAIL=30 step bench 300 python3 -m bench cookbook,sweep --model qwen3.5-0.8b --device cuda --dtype bfloat16 \
  --max-model-len 9216 --max-num-seqs 16 --no-mixed-steps -p cookbook.concurrency=1,16 -p sweep.batches=1,2,4,8,16 \
  --out $W/bench
TAIL=24 step spec 220 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 \
  --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10 \
  -p spec.draft_vocab_size=32768 -p spec.repeats=2 --out $W/spec
TAIL=8 step tests 60 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "attention_decode or split_ceiling"
TAIL=12 step fla_configs 100 python3 bench/fla_configs.py --model qwen3.5-0.8b --max-num-seqs 64 \
  --max-model-len 9216 --out $W/fla_kernel_configs
