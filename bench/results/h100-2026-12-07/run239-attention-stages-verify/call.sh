#!/bin/bash
# Any GPU (~7 min): the decode attention kernels at 1 pipeline stage up to 4 query rows (run 238: the op -2 to -3 µs a
# call at 1-4 sequences, the decode graph -9 / -50 / -32 µs at batch 1 / 2 / 4 and context 8,192). Now also the paged
# decode kernel, which runs a batch-1 verify's 3 rows (k = 2). (1) The attention kernels' GPU tests at the new
# rule; (2) `bench spec` batch 1, k = 2, forced 0.8 with the rule, then with Triton's default stages
# (stages_default.patch). Predicted: the verify graph -5 to -15 µs (6 layers at short context, ~-1 to -2 µs a
# layer), the decode graph -5 to -10; the verify / decode ratio about level; the speed-up +0.5-1%.
RUN=${RUN_NAME:-run239} source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=8 step tests 110 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py \
  -k "attention_decode or paged_decode or paged_attention or verify"
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1
  --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10
  -p spec.draft_vocab_size=32768 -p spec.repeats=1)
TAIL=24 step spec_rule 200 "${SPEC[@]}" --out $W/spec_rule
git apply bench/pending/run239/stages_default.patch && echo "stages_default.patch applied"
TAIL=24 step spec_default 140 "${SPEC[@]}" --out $W/spec_default
