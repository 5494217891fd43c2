#!/bin/bash
# Prepared in session 26 (no device lent), not run yet; after run145 (carry the .cecache it exports). Run from the
# repository root with nothing applied; when it has run, move this folder under bench/results/ with its results.
#  - splitnorm.patch: e673815's split norm restored (the reverse of ffb3b37) with VERIFY_LAUNCHES at 1-2 sequences V
#    blocks of 32, 4 warps, the norm by each key head's last program. One call a graph it was level with whole heads
#    (run 137: 12.90 against 13.12 µs at one sequence); in the verify graph, where run 123 charged the V blocks 102 µs
#    against whole heads' 162 (the norm kernel then +80), it was never timed. Predicted: -30 to -50 µs of the
#    batch-1, k = 2 verify graph against run145's spec step.
# `--max-num-seqs 1`: one bucket to compile (run 141 compiled four, 1-8, for batch-1 figures; the CPU runs it).
RUN=run146 source bench/device_env.sh || exit 1
P=bench/pending/run146
git apply $P/splitnorm.patch || exit 1
TAIL=6 step tests 120 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "verify_in_v_blocks or verify_replays or gated_deltanet_verify_matches"
TAIL=30 step spec 220 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=1 --out $W/spec
