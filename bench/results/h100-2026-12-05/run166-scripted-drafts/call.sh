#!/bin/bash
# Scripted drafts (9b0886d) on a GPU: the captured rounds read the draft script in place (its GPU test), then `bench
# spec` at batch 1, k = 2, forced 0 and 0.8, whose forced rounds now chain as the MTP head's do. Any GPU (an H100
# compares within the call only). Predicted on an H100: forced 0.8's decode speed-up near run 160's chained-derived
# 1.47x (unchained 1.13x there), `chained_rounds` > 0 in every forced run.
RUN=run166 source bench/device_env.sh || exit 1
TAIL=8 step gpu_test 75 python3 -m pytest -q -m gpu tests/test_speculative.py -k read_the_draft_script -p no:cacheprovider
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=1)
TAIL=14 step spec 170 "${SPEC[@]}" --out $W/spec
# The GPU test's step was cut at its 75 s (the call's first compile of the fp32 rounds); on the warm machine after,
# `timeout --signal=INT 110 python3 -m pytest -q -m gpu tests/test_speculative.py -k read_the_draft_script` passed
# (1 passed in 19.1 s; output not kept).
