#!/bin/bash
# As it ran (device tool, kind nvidia-h100-x1, nothing carried: this session's checkout had no .whl or .cecache, so
# bench/pending/run177/call.sh's `source bench/device_env.sh` stopped at the wheels; its GEMV steps need no FLA).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CE_NO_SHRINK=1; mkdir -p $OUT
(timeout 150 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -p no:cacheprovider -k "linear or skinny or gemv or words" 2>&1 | tail -15) | tee $OUT/tests.log
timeout 200 python3 bench/gemv_chain.py --out $OUT/chain --rows 1,2,3,4 --passes 0 --flags READ_WORDS=1,GEMV_UNROLL=2 --flags READ_WORDS=1 --flags GEMV_UNROLL=2 --flags GEMV_X_TILE=1 2>&1 | grep -v Warn | tail -45 | tee $OUT/chain.log
