#!/bin/bash
# The GDN verify in closed form (S0^T k_i and S0^T q_i for every position at once, then the positions in turn on
# [BLOCK_V] vectors; no state tile updated) against the walk of positions it replaces (closed_form.patch reversed).
# Any GPU (a comparison within the call). Predicted: the verify op at batch 1, P = 3 (the rule's V blocks of 32, split
# norm) ~-1 to -3 µs a layer (the walk's 3 dependent tile passes a position gone; 87 barriers against 69, 120
# registers against 164), the batch-1 k = 2 verify graph -20 to -50 µs (18 layers); at 16-64 sequences level or
# better (fewer registers).
RUN=run167 source bench/device_env.sh || exit 1
SKIP=store_kv,paged_attention_decode,paged_attention_prefill,causal_conv1d_decode,causal_conv1d_prefill,gated_delta_rule_decode,gated_delta_rule_prefill,gated_deltanet_commit,linear,sweep
MICRO=(python3 bench/ops_microbench.py --batches 1,4,16,64 --skip $SKIP --no-baseline)
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=1)
TAIL=8 step tests 150 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "gated_deltanet_verify" -p no:cacheprovider
TAIL=40 step micro_closed 90 "${MICRO[@]}" --out $W/micro_closed
TAIL=12 step spec_closed 170 "${SPEC[@]}" --out $W/spec_closed
git apply -R bench/pending/run167/closed_form.patch && echo "the walk restored"
TAIL=40 step micro_walk 60 "${MICRO[@]}" --out $W/micro_walk
TAIL=12 step spec_walk 120 "${SPEC[@]}" --out $W/spec_walk
git apply bench/pending/run167/closed_form.patch
export_caches
