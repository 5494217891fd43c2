#!/bin/bash
# Any GPU (~8 min). Run 223 found the first sampled burst of a process compiling 11 ce::sample kernels (7.0 s at
# 1 row, 6.6 s again at 64 rows: the larger chunk) on an empty Triton cache: the eager sampler (fp32 prompt logits,
# top-k / top-p flags per batch) meets variants the decode graphs' (model dtype, both flags on) never compiled.
# Now LLMEngine compiles them at start-up (warm_up_sampling) and the radix pass's shift is not specialised.
# Predicted: no variant compiled in any burst of any mode; the warm-up ~15-25 s on an empty cache (its log line).
RUN=run224 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
export TRITON_CACHE_DIR=/tmp/ce_triton_cold  # empty: no .cecache carried
TAIL=90 step cold 280 python3 bench/cold_steps.py --model qwen3.5-0.8b --bursts 1x512,8x512,24x512,64x128,1x8192 \
  --out $W/cold
TAIL=12 step tests 170 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_sampling.py tests/test_kernels_cuda.py \
  -k "no_sampling_kernel or sample_matches or sample_many"
