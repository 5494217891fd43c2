#!/bin/bash
# Any GPU. The residual add + norm between the matmuls without a norm kernel at 2-5 rows (an experiment in the
# 97-matmul chain, `rule, norm partials`): out_proj and down add the residual in their epilogue and store each
# program's sum of squares; in_proj / qkv and gate_up take each row's rstd from those partials after their wait and
# scale x as they load it. Run 186 charged the 50 ce::add_rms_norm hops 62-70 µs of the k = 2 round (3 rows) and
# 106 µs of the k = 4 round (5 rows). Predicted: -30 to -60 µs a chain step at 2-5 rows (a hop ~1.3 µs, the
# consumer's partials and norm weight loads ~0.3-0.5). (1) The chain at 2, 3, 4, 5 rows, profiled; (2) the skinny GEMM's GPU tests (the
# kernel's new constexprs off: the same paths) with the 5-row norm cases.
RUN=run188 source bench/device_env.sh || exit 1
TAIL=60 step chain 130 python3 bench/gemv_chain.py --out $W/chain --rows 3,5,2,4 --passes 0 --profile
TAIL=6 step tests 70 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "linear or skinny" -p no:cacheprovider
