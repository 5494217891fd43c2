#!/bin/bash
# Any GPU (~2 min cold). run219's one failure, mended: the GPU test of captured steps of several sequences expected
# the four-fold keys (1 and 4 sequences); with two-fold buckets it captures 1, 2 and 4 and each step replays the key
# written out in the test. The test's own comparison with the eager runtime never ran in run219 (it stopped at the keys).
RUN=run220 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=30 step tests 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_prefill_graphs.py \
  -k "several_sequences_equal_eager_ones_on_gpu"
