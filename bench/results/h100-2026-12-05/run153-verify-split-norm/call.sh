#!/bin/bash
# Prepared in session 28, not run yet; after run152 (or alone). Run from the repository root with nothing applied;
# when it has run, move this folder under bench/results/ with its results.
# The GDN verify's split norm past 2 sequences, in the verify graph: run 137 timed it level with whole heads at
# 1-16 sequences one call a graph, yet in the batch-1 verify graph it took 24 µs off (runs 146, 149). Here `bench
# spec` at batches 4 and 8, k = 2, with the rule (whole heads at 3-16 sequences), then with V blocks of 32 and the
# split norm up to 16 (sed on VERIFY_LAUNCHES), then the rule again. Predicted: -20 to -40 µs of verify graph at 4,
# level or worse at 8 (the last program's norm of 3 positions x G heads is a tail).
RUN=run153 source bench/device_env.sh || exit 1
F=ops/triton/gated_deltanet_kernels.py
RULE='VERIFY_LAUNCHES = ((2, 32, 4, True), (16, None, 8, False), (math.inf, 64, 4, False))'
SPLIT='VERIFY_LAUNCHES = ((16, 32, 4, True), (math.inf, 64, 4, False))'
grep -qxF "$RULE" $F || { echo "VERIFY_LAUNCHES is not the rule this call expects"; exit 1; }
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 8 --max-model-len 512 -p spec.batches=4,8 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=1)
TAIL=12 step spec_rule 300 "${SPEC[@]}" --out $W/spec_rule
sed -i "s/^$RULE\$/$SPLIT/" $F && grep -cxF "$SPLIT" $F
TAIL=12 step spec_split 150 "${SPEC[@]}" --out $W/spec_split
sed -i "s/^$SPLIT\$/$RULE/" $F
TAIL=12 step spec_rule2 120 "${SPEC[@]}" --out $W/spec_rule2
export_caches
