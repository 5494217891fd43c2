#!/bin/bash
# Any GPU. ce::linear's skinny GEMM up to 5 rows (SKINNY_MAX_ROWS 4 -> 5; run 184: the 97-matmul chain at 5 rows
# 873.4 µs on the few-rows GEMV as 4 + 1 rows against cuBLAS's 1,000.4). (1) The linear ops' GPU tests at the new
# ceiling (the model's shapes at 5 rows, ragged shapes up to 5 rows, the dispatch at 6). (2) The chain at 6, 7 and 8
# rows (BLOCK_M 8, padded rows) against cuBLAS, then one descent pass at 8 rows: whether the ceiling goes further.
# Predicted: 6-7 rows near the 8-row rule (1,050 against cuBLAS 1,004), the descent within ~3% of cuBLAS.
RUN=run185 source bench/device_env.sh || exit 1
TAIL=8 step tests 200 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "linear or skinny" -p no:cacheprovider
TAIL=12 step chain67 90 python3 bench/gemv_chain.py --out $W/chain67 --rows 6,7 --passes 0
TAIL=40 step chain8 200 python3 bench/gemv_chain.py --out $W/chain8 --rows 8 --passes 1 \
  --roles gdn_in_proj,mlp_gate_up,mlp_down,out_proj,attn_qkv
