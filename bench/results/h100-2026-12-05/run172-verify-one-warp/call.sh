#!/bin/bash
# Any GPU (an A/B within the call). The GDN verify at one warp a program (V blocks of 16 over programs, the split
# norm): its reductions over K stay in the warp (bench/sass_stats.py: 11 barriers against the rule's 69 at V blocks of
# 32, 4 warps) at twice the instructions a warp and 128 programs at batch 1. (1) its GPU test; (2) ops_microbench's
# verify rows at 1, 2 and 4 sequences (the `v16 split 1 warp` row against the rule's `v32 split`); (3) `bench spec`
# batch 1, k = 2 with the rule, then with VERIFY_LAUNCHES' first entry at (16, 1, split) (sed), then the rule again.
# Predicted: level to -1 µs a call alone; in the verify graph, where the walk after the PDL wait is what is charged,
# -10 to -30 µs (18 layers), or a loss if the single warp's instruction stream is the longer path.
RUN=run172 source bench/device_env.sh || exit 1
F=ops/triton/gated_deltanet_kernels.py
RULE='VERIFY_LAUNCHES = ((2, 32, 4, True), (16, None, 8, False), (math.inf, 64, 4, False))'
ONE='VERIFY_LAUNCHES = ((2, 16, 1, True), (16, None, 8, False), (math.inf, 64, 4, False))'
grep -qxF "$RULE" $F || { echo "VERIFY_LAUNCHES is not the rule this call expects"; exit 1; }
TAIL=6 step tests 150 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "verify_in_v_blocks" -p no:cacheprovider
SKIP=store_kv,paged_attention_decode,paged_attention_prefill,causal_conv1d_decode,causal_conv1d_prefill,gated_delta_rule_decode,gated_delta_rule_prefill,gated_deltanet_commit,gated_deltanet_decode,linear,sweep
TAIL=30 step micro 60 python3 bench/ops_microbench.py --batches 1,2,4 --skip $SKIP --no-baseline --out $W/micro
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=1)
TAIL=12 step spec_rule 170 "${SPEC[@]}" --out $W/spec_rule
sed -i "s/^$RULE\$/$ONE/" $F && grep -cxF "$ONE" $F
TAIL=12 step spec_one_warp 120 "${SPEC[@]}" --out $W/spec_one_warp
sed -i "s/^$ONE\$/$RULE/" $F
TAIL=12 step spec_rule2 120 "${SPEC[@]}" --out $W/spec_rule2
export_caches
