#!/bin/bash
# Any GPU (~7 min). 1) test_speculative.py's GPU tests, not yet run on cff45d7 (speculative prompt steps of several
# sequences captured with their drafts). 2) run214's kernels of a padded 17-sequence prompt step (the 64 key: 47
# padding sequences) against 16: where its other ~2.2 ms go (run 210, H100: 7.41 against 5.22 ms).
RUN=run217 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=8 step spec_gpu_tests 200 python3 -m pytest -q -m gpu tests/test_speculative.py -p no:cacheprovider
PROFILE=(python3 -m bench step_profile --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 64
  -p step_profile.batches=1 -p step_profile.prefill_len=16 -p step_profile.engine=false)
TAIL=30 step prof17 110 "${PROFILE[@]}" -p step_profile.prefill_seqs=17 --out $W/prof17
TAIL=30 step prof16 80 "${PROFILE[@]}" -p step_profile.prefill_seqs=16 --out $W/prof16
