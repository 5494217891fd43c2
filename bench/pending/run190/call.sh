#!/bin/bash
# Any GPU (~90 s). The 5-row few-rows GEMV with 8 columns a program: one descent pass of the 97-matmul chain at 5
# rows, whose candidates now include 4 + 1 x 8 tiles (bench/gemv_chain.py counts a tile's rows as 4 + 1, not 8).
# The rule gives 5 rows 4 columns, from the padded tile of 8's register budget. Offline (bench/gemv_sass.py, sm_90a):
# 4 + 1 x 8 runs 595 loop instructions a chunk for 8 columns (74 a column) against 4 + 1 x 4's 355 for 4 (89), no
# spill, 165-190 registers against 124 (the 2-warp wide roles: ~6 programs an SM instead of 8). Run 188: the chain at
# 5 rows 869.9 µs (4 rows 823.5). Predicted: -10 to -30 µs at 5 rows; if the descent keeps 8 columns for a role
# beyond ~5 µs, gemv_rows_config gives EXTRA_ROW tiles the columns of their real rows, then `bench spec` k = 4.
RUN=run190 source bench/device_env.sh || exit 1
TAIL=40 step chain5 150 python3 bench/gemv_chain.py --out $W/chain5 --rows 5 --passes 1
# Then ce::silu_mul_linear's GPU test with its 5-row case (the MoE shared expert's down at 4 + 1 rows; added after
# run 188, checked in the interpreter only).
TAIL=6 step tests 60 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "silu_mul_linear_on_model_shapes" \
  -p no:cacheprovider
