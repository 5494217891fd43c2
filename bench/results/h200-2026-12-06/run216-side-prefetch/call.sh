#!/bin/bash
# Any GPU (~9 min). The side stream's L2 prefetch (CE_SIDE_PREFETCH): 1) the 97-matmul chain with a second stream
# prefetching the next matmuls' weights (gemv_chain --side; at 8 and 16 rows cuBLAS runs at ~40% of the weights'
# bound, so the DRAM idles between matmuls). Predicted: ~1.2-1.9 µs a matmul where the weight was prefetched (run
# 205), up to ~-150 µs a step at 16 rows, if the prefetches do not slow the matmuls they overlap. 2) the GPU test of
# the captured decode graphs with the option on. 3) The decode graph at batch 8 / 16, context 8,192 (c16's step),
# option off then on (step_paths).
RUN=run216 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=30 step chain 150 python3 bench/gemv_chain.py --out $W/chain --rows 1,8,16 --passes 0 --side 16:1,16:2:2
TAIL=8 step side_test 150 python3 -m pytest -q -m gpu tests/test_compile_gpu.py -k side_prefetch -p no:cacheprovider
PATHS=(python3 bench/step_paths.py --batches 8,16 --context 8192 --max-model-len 9216 --top 12)
TAIL=16 step paths_off 170 env CE_SIDE_PREFETCH=0 "${PATHS[@]}" --out $W/paths_off
TAIL=16 step paths_on 100 env CE_SIDE_PREFETCH=1 "${PATHS[@]}" --out $W/paths_on
