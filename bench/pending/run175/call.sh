#!/bin/bash
# Any GPU. The verify step's attention fused (`fused.patch`: ce::attention_decode over R = k + 1 rows a sequence, each
# row a query of the decode kernel, the step's new tokens folded in from registers), on top of the verify attention's
# gate in its kernels (the tree before fused.patch). (1) the GPU tests of both (the op's verify rows and decode
# against the reference, the verify attention plain and gated, opcheck); (2) `bench spec` batch 1, k = 2, forced 0.8
# (its greedy outputs checked against the baseline's), with fused.patch, then without it (`git apply -R`).
# Predicted: the round graph -25 to -35 µs (run 174: ~12.3 µs a verify attention layer between qkv and o_proj, 7 a
# round: the prologue 3.1, the rows' split decode 5.4, the reduce 2.2, the gate 1.6; the fused one-row decode 9.5),
# the compiled verify graph -20 to -30 µs (1.241 -> ~1.21 decode graphs); the decode graph level (its kernel's
# R = 1 path computes the new token's score as a [G, 1, D] product).
RUN=run175 source bench/device_env.sh || exit 1
P=bench/pending/run175/fused.patch
git apply -R --check $P || { echo "the tree does not carry fused.patch"; exit 1; }
TAIL=8 step tests 150 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -p no:cacheprovider \
  -k "attention_decode or paged_attention_verify or opcheck"
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=3)
TAIL=16 step spec_fused 170 "${SPEC[@]}" --out $W/spec_fused
git apply -R $P && echo "fused.patch reversed"
TAIL=16 step spec_gate 130 "${SPEC[@]}" --out $W/spec_gate
export_caches
