#!/bin/bash
# Any GPU: the final tree's decode and verify kernels against the references (the decode reference now writes a
# padding lane's slot rows back instead of skipping them by a boolean index), and the compiled decode's GPU tests:
# graphs across buckets (padding lanes) against eager steps and solo runs.
RUN=run204 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=8 step tests 230 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_compile_gpu.py tests/test_kernels_cuda.py \
  -k "test_compile_gpu or gated_delta_rule_decode or gated_deltanet_decode or gated_deltanet_verify"
