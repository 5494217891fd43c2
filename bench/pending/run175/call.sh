#!/bin/bash
# Any GPU. The verify attention's output gate in its kernels (`gate.patch`: ce::paged_attention_verify takes the gate;
# the reduce kernel, the one-split decode kernel and the prefill kernel apply it where they write): (1) its GPU tests
# (the kernels against the reference, plain and gated, both paths; opcheck); (2) `bench spec` batch 1, k = 2, forced
# 0.8 with it (its greedy outputs checked against the baseline's), then without it (`git apply -R`).
# Predicted: the round graph -8 to -12 µs (7 Inductor gate kernels of ~1.6 µs charged, run 174), the compiled verify
# graph -8 to -10 (6), the eager verify graph -25 to -30 (its sigmoid, product and copy kernels).
RUN=run175 source bench/device_env.sh || exit 1
P=bench/pending/run175/gate.patch
git apply -R --check $P || { echo "the tree does not carry gate.patch"; exit 1; }
TAIL=6 step tests 120 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "paged_attention_verify or opcheck" -p no:cacheprovider
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=3)
TAIL=14 step spec_gate 170 "${SPEC[@]}" --out $W/spec_gate
git apply -R $P && echo "gate.patch reversed"
TAIL=14 step spec_before 130 "${SPEC[@]}" --out $W/spec_before
export_caches
