#!/bin/bash
# Any GPU (~9 min). 1) test_speculative.py's GPU tests, not yet run on cff45d7 (speculative prompt steps of several
# sequences captured with their drafts). 2) On an H200: run189's batch-8 cell of #23's table (k = 2, forced 0.8 and 1,
# the MTP head with and without the rule; the H100's run 211 gave 1.71x / 2.12x / 0.80x / 0.99x). Elsewhere: run214's
# kernels of a padded 17-sequence prompt step against 16 (where its other ~2.2 ms go).
RUN=run217 source bench/device_env.sh || exit 1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
TAIL=8 step spec_gpu_tests 200 python3 -m pytest -q -m gpu tests/test_speculative.py -p no:cacheprovider
if [[ $GPU == *H200* ]]; then
  SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-model-len 512
    -p spec.ks=2 -p spec.rates=0.8,1.0 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=2)
  TAIL=16 step spec_b8 300 "${SPEC[@]}" --max-num-seqs 8 -p spec.batches=8 --out $W/spec_b8
else
  PROFILE=(python3 -m bench step_profile --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 64
    -p step_profile.batches=1 -p step_profile.prefill_len=16 -p step_profile.engine=false)
  TAIL=30 step prof17 110 "${PROFILE[@]}" -p step_profile.prefill_seqs=17 --out $W/prof17
  TAIL=30 step prof16 90 "${PROFILE[@]}" -p step_profile.prefill_seqs=16 --out $W/prof16
fi
