#!/bin/bash
# Any GPU (~5 min). warm_up_sampling now also compiles the model dtype's draws in every top-k / top-p case (an eager
# engine's decode rows; decode rows that suppress their stop tokens, min_tokens): 16 draws and the penalties' kernel
# where run 226 had 8 and it. Each process starts on an empty Triton cache: fp32 model (8 draws), bf16 model (16),
# twice each, 8 threads. Then the GPU tests: no sampling or penalty kernel compiles while serving (fp32 and bf16
# eager engines, now with min_tokens), the sampler's and penalties' kernels against references.
RUN=run227 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
warm() {
    TRITON_CACHE_DIR=$(mktemp -d) python3 -c "
import time, torch, ops
from compiled_engine.sampler import warm_up_sampling
torch.zeros(1, device='cuda'); torch.cuda.synchronize()
t = time.perf_counter(); warm_up_sampling(248320, 256, torch.device('cuda'), model_dtype=torch.$1); torch.cuda.synchronize()
print('model dtype $1: warm-up %.1f s' % (time.perf_counter() - t))"
}
TAIL=4 step warm_up 240 bash -c "$(declare -f warm); warm float32; warm bfloat16; warm float32; warm bfloat16"
TAIL=12 step tests 300 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_sampling.py tests/test_penalties.py \
  tests/test_kernels_cuda.py -k "no_sampling_kernel or penalt or sample_matches or sample_many"
