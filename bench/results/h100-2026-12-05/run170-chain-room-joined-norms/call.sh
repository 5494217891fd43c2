#!/bin/bash
# Any GPU (an A/B within the call). (1) `bench spec` batch 1, k = 2, forced 0.8 with CHAIN_ROUNDS 32 (run 169 had 8):
# predicted decode speed-up 1.627x -> ~1.65x, the rule log's long rounds (chain breaks) one in ~40 instead of ~15.
# (2) joined_norms.patch: the GDN decode and verify kernels' q and k sums of squares in one reduction (tl.join):
# 2 barriers fewer a position (verify at V blocks of 32: 69 -> 63; decode split 31 -> 29), predicted -0.1 to -0.3 µs
# a call; the verify op and decode op rows of ops_microbench before and after.
RUN=run170 source bench/device_env.sh || exit 1
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=1)
SKIP=store_kv,paged_attention_decode,paged_attention_prefill,causal_conv1d_decode,causal_conv1d_prefill,gated_delta_rule_decode,gated_delta_rule_prefill,gated_deltanet_commit,linear,sweep
MICRO=(python3 bench/ops_microbench.py --batches 1,4,16 --skip $SKIP --no-baseline)
TAIL=10 step spec 170 "${SPEC[@]}" --out $W/spec
TAIL=4 step micro 60 "${MICRO[@]}" --out $W/micro
git apply bench/pending/run170/joined_norms.patch && echo "joined norms applied"
TAIL=4 step micro_joined 60 "${MICRO[@]}" --out $W/micro_joined
git apply -R bench/pending/run170/joined_norms.patch
