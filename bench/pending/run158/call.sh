#!/bin/bash
# Session 30's second call: the SiLU gate in gate_up's epilogue (6ac4dbf) in whole steps against the gate in down's
# prologue (`gate_in_down.patch`: the model's layer calls as before 6ac4dbf, ce::silu_mul_linear):
#  - `bench spec` at batch 1, k = 2 with the patch (run156's spec_epilogue is the A);
#  - the batch-1 decode graph at context 8,192 (`step_paths.py`; run 149: 0.754 ms), A/B/A.
# Predicted: -30 µs of verify graph, -15 to -25 µs a decode step. Run from the repository root with nothing applied
# (carry .whl, .cecache).
RUN=run158 source bench/device_env.sh || exit 1
P=bench/pending/run158/gate_in_down.patch
PATHS=(python3 bench/step_paths.py --batches 1 --context 8192 --max-model-len 9216 --top 12)
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=1)
git apply $P || exit 1
TAIL=14 step spec_prologue 150 "${SPEC[@]}" --out $W/spec_prologue
TAIL=16 step paths_prologue 150 "${PATHS[@]}" --out $W/paths_prologue
git apply -R $P || exit 1
TAIL=16 step paths_epilogue 100 "${PATHS[@]}" --out $W/paths_epilogue
git apply $P || exit 1
TAIL=16 step paths_prologue2 90 "${PATHS[@]}" --out $W/paths_prologue2
git apply -R $P || exit 1
export_caches
