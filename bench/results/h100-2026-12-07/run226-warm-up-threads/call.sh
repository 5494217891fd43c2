#!/bin/bash
# Any GPU (~6 min). warm_up_sampling compiles its cases on a thread pool (Triton's passes and ptxas run mostly
# outside the GIL: 8 sm_90 compiles of the radix kernel took 6.0 s one by one against 3.6 s on two threads, on the
# 2-core CPU machine). Each process below starts on an empty Triton cache and times the warm-up alone at the
# defaults' shape (Qwen3.5's vocabulary, 256 rows): 1 thread (before) and 8 (the default), twice each, alternating.
# Then the GPU tests: no sampling or penalty kernel compiles while serving; the sampler's kernels against references.
RUN=run226 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
nproc
warm() {
    TRITON_CACHE_DIR=$(mktemp -d) python3 -c "
import sys, time, torch, ops
from compiled_engine.sampler import warm_up_sampling
torch.zeros(1, device='cuda'); torch.cuda.synchronize()
t = time.perf_counter(); warm_up_sampling(248320, 256, torch.device('cuda'), threads=$1); torch.cuda.synchronize()
print('threads $1: warm-up %.1f s' % (time.perf_counter() - t))"
}
TAIL=3 step warm_up 300 bash -c "$(declare -f warm); warm 1; warm 8; warm 1; warm 8; warm 16"
TAIL=12 step tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_sampling.py tests/test_penalties.py \
  tests/test_kernels_cuda.py -k "no_sampling_kernel or penalt or sample_matches or sample_many"
