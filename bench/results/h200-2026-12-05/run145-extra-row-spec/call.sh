#!/bin/bash
# Prepared in session 26 (no device lent), not run yet. Run from the repository root; when it has run, move this
# folder under bench/results/ with its results.
#  - The few-rows GEMV at 3 rows as 2 + 1 (EXTRA_ROW, 9f1dec1, in the tree): A/B/A against the padded tile of 4 (the
#    launcher's EXTRA_ROW switched off by sed) in the 97-matmul chain at 3 rows (a k = 2 verify's). Run 130: rule
#    734.7 µs a step at 3 rows, 754.6 at 4, ~640 at 2. Predicted: ~700 (-35 µs), from the loop's 435 instructions
#    against 524 (Triton 3.9, sm_90).
#  - `bench spec` at batch 1, k = 2 with EXTRA_ROW (run 141: verify graph 1,015.4 µs = 1.47 decode graphs).
# `--max-num-seqs 1`: one bucket to compile (run 141 compiled four, 1-8, for batch-1 figures; the CPU runs it).
RUN=run145 source bench/device_env.sh || exit 1
OFF='s/^    extra_row = block_m > 2 and not dot/    extra_row = False and block_m > 2 and not dot/'
TAIL=6 step tests 110 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "skinny_gemm_on_model or every_rule_config or add_rms_norm_linear_on_model or silu_mul_linear_on_model or linear_chain_with_pdl or skinny_gemm_ragged"
TAIL=6 step rows3_extra 60 python3 bench/gemv_chain.py --out $W/rows3_extra --rows 3 --passes 0
cp ops/triton/gemv_kernels.py /tmp/gemv_kernels.py && sed -i "$OFF" ops/triton/gemv_kernels.py && grep -c "extra_row = False and" ops/triton/gemv_kernels.py
TAIL=6 step rows3_padded 60 python3 bench/gemv_chain.py --out $W/rows3_padded --rows 3 --passes 0
cp /tmp/gemv_kernels.py ops/triton/gemv_kernels.py
TAIL=6 step rows3_extra2 60 python3 bench/gemv_chain.py --out $W/rows3_extra2 --rows 3 --passes 0
TAIL=30 step spec 270 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=1 --out $W/spec
export_caches
