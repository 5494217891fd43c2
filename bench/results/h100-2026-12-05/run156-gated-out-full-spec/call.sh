#!/bin/bash
# Session 30's first call: the GPU tests of everything in the tree that has run on the CPU only (ce::sample's aligned
# workspace views 7dfa8f5, ce::apply_penalties_, the GEMV's FULL loops, the SiLU gate in gate_up's epilogue:
# ce::add_rms_norm_linear_silu_mul), then the 97-matmul chain at 1, 2 and 3 rows with FULL_TILES on, then off (sed);
# each run times the rule (the gate in gate_up's epilogue, down plain) beside "down prologue" (the gate in down's
# prologue, as before) in one process; then `bench spec` at batch 1, k = 2 (the verify graph against run 149's 912.2
# µs). Predicted: FULL level at one row, -10 to -20 µs at 3 rows, possibly a loss at 2 rows; the epilogue -10 to -25
# µs at one row, -25 to -45 at 2-3 rows (down's programs no longer recompute silu over its whole K); the verify graph
# ~-30 µs (toward 1.25 decode graphs). Run from the repository root with nothing applied (carry .whl, .cecache).
RUN=run156 source bench/device_env.sh || exit 1
F=ops/triton/gemv_kernels.py
grep -qx 'FULL_TILES = True' $F || { echo "FULL_TILES is not the switch this call expects"; exit 1; }
K="sample_matches_reference_after_lm_head or sample_many_small_rows or sampled_replays or apply_penalties"
K="$K or skinny_gemm_on_model or every_rule_config or add_rms_norm_linear_on_model or silu_mul"
K="$K or linear_chain_with_pdl or skinny_gemm_ragged"
TAIL=10 step tests 200 python3 -m pytest -q -n 6 -m gpu tests/test_kernels_cuda.py tests/test_compile_gpu.py -k "$K"
TAIL=12 step chain_full 100 python3 bench/gemv_chain.py --out $W/chain_full --rows 1,2,3 --passes 0
sed -i 's/^FULL_TILES = True$/FULL_TILES = False/' $F && grep -cx 'FULL_TILES = False' $F
TAIL=12 step chain_masked 90 python3 bench/gemv_chain.py --out $W/chain_masked --rows 1,2,3 --passes 0
sed -i 's/^FULL_TILES = False$/FULL_TILES = True/' $F
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=1)
TAIL=14 step spec_epilogue 150 "${SPEC[@]}" --out $W/spec_epilogue
export_caches
