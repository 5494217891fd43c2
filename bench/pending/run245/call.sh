#!/bin/bash
# Any GPU (~6 min): the attention's split ceiling at 128 (MAX_SPLITS; the rule's count at batch 1 on 132 SMs). First
# the attention GPU tests, the new one at the ceiling included (batch 1 over a 9,216-token table, contexts 1 to
# 9,216); then run 241's `bench spec` (batch 1, k = 2, forced 0.8, an 8,192-token prompt), whose decode steps run at
# 8,192-8,320 tokens (3 key tiles a split at 64 splits, 2 at 128) and whose MTP draft attends at batch 1. Predicted
# against run 241's first step: decode graph 0.858 -> ~0.845 ms, verify graph level (its rows keep 32 splits), round
# graph -3 to -8 µs (two draft attention calls).
RUN=${RUN_NAME:-run245} source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=8 step tests 170 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "attention_decode or split_ceiling"
TAIL=24 step spec 240 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 \
  --max-num-seqs 1 --max-model-len 9216 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10 \
  -p spec.prompt_len=8192 -p spec.draft_vocab_size=32768 -p spec.repeats=1 --out $W/spec
