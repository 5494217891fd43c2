#!/bin/bash
# Any GPU (~3 min). Run 224: no ce::sample variant compiled in any burst after start-up (the warm-up 33.0 s on an
# empty Triton cache), but the penalties' kernel compiled in the first penalised burst (554 ms). Now the warm-up
# compiles it too, its per-row strides unspecialised. The GPU tests: no sampling or penalty kernel compiles while
# serving; the penalties' and the sampler's kernels against their references.
RUN=run225 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=12 step tests 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_sampling.py tests/test_penalties.py \
  tests/test_kernels_cuda.py -k "no_sampling_kernel or penalt or sample_matches or sample_many"
