#!/bin/bash
# Any GPU: where cuBLAS runs the matmuls (6+ rows), the kernel before each one (the residual add + norm before
# in_proj / qkv and gate_up, the activation before down) prefetches its weight into L2. The 97-matmul chain at 16 and
# 8 rows with and without the prefetches (one process), the decode graph at batch 16 and 8, context 8,192 (c16's
# step) without CE_L2_PREFETCH=0 and with it, then the kernels' GPU tests. Predicted: -1 to -3 µs a prefetched call
# (72 a step): -70 to -200 µs at 16 rows.
RUN=run205 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=30 step chain 150 python3 bench/gemv_chain.py --out $W/chain --rows 16,8 --passes 0 --profile
SP="python3 bench/step_paths.py --model qwen3.5-0.8b --batches 16,8 --context 8192 --max-model-len 9216"
TAIL=30 step paths_on 170 $SP --out $W/paths_on
TAIL=30 step paths_off 140 env CE_L2_PREFETCH=0 $SP --out $W/paths_off
TAIL=8 step tests_prefetch 100 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_cuda.py \
  -k "add_rms_norm or silu_mul"
