#!/bin/bash
# Session 31's second call (after run156 on an H100): the GPU tests again with the float64 check of
# ce::add_rms_norm_linear_silu_mul as a relative bound (run156's absolute 5e-2 failed at 16 rows: 5.09e-2 on a
# correct output) and the few-rows GEMV masked again (FULL at one row only); the chain at 1-3 rows, then at one row
# with FULL_TILES off (the in-run baseline of FULL's one-row win); `bench spec` at batch 1, k = 2 (the verify graph
# against run156's 1.77 decode graphs with FULL at 3 rows); then run157's penalty calls. Predicted: the chain's 3 rows
# back at ~781 µs (run156's masked run), 1 row ~680 with FULL against ~698 without; the verify graph ~1.3 decode
# graphs. Run from the repository root with nothing applied (carry .whl, .cecache).
RUN=run160 source bench/device_env.sh || exit 1
F=ops/triton/gemv_kernels.py
grep -qx 'FULL_TILES = True' $F || { echo "FULL_TILES is not the switch this call expects"; exit 1; }
K="sample_matches_reference_after_lm_head or sample_many_small_rows or sampled_replays or apply_penalties"
K="$K or skinny_gemm_on_model or every_rule_config or add_rms_norm_linear_on_model or silu_mul"
K="$K or linear_chain_with_pdl or skinny_gemm_ragged"
TAIL=6 step tests 200 python3 -m pytest -q -n 6 -m gpu tests/test_kernels_cuda.py tests/test_compile_gpu.py -k "$K"
TAIL=8 step chain 90 python3 bench/gemv_chain.py --out $W/chain --rows 1,2,3 --passes 0
sed -i 's/^FULL_TILES = True$/FULL_TILES = False/' $F && grep -cx 'FULL_TILES = False' $F
TAIL=4 step chain_masked1 60 python3 bench/gemv_chain.py --out $W/chain_masked1 --rows 1 --passes 0
sed -i 's/^FULL_TILES = False$/FULL_TILES = True/' $F
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=1)
TAIL=8 step spec 100 "${SPEC[@]}" --out $W/spec
# run157: the penalised engine's GPU tests; `bench sampling` with the penalty kernel, with its reference, and plain
P=ops/penalties.py
KERNEL='    cuda=penalty_kernels.apply_penalties_ if HAVE_TRITON else None,'
grep -qxF "$KERNEL" $P || { echo "ops/penalties.py is not the registration this call expects"; exit 1; }
TAIL=4 step penalties 100 python3 -m pytest -q -m gpu tests/test_penalties.py
B=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096)
TAIL=6 step pen_kernel 120 python3 -m bench sampling "${B[@]}" -p sampling.repetition_penalty=1.1 --out $W/pen_kernel
sed -i "s/^$KERNEL\$/    cuda=None,/" $P && grep -cx '    cuda=None,' $P
TAIL=6 step pen_reference 100 python3 -m bench sampling "${B[@]}" -p sampling.repetition_penalty=1.1 --out $W/pen_reference
sed -i "s/^    cuda=None,\$/$KERNEL/" $P
TAIL=6 step sampling 90 python3 -m bench sampling "${B[@]}" --out $W/sampling
export_caches
