#!/bin/bash
# Session 22, call 4 (the last ~370 s of device time): the skinny GEMM's GPU tests after the norm prologue went to the
# one-row GEMV only (a58a608), and the matmul chain at 1-4 rows (run 122: 562.6 / 625.5 / 751.1 / 754.6 µs).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run124; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run124.tgz -C $W .; }
TAIL=6 step tests 120 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "linear or skinny or opcheck_on_cuda or runs_our_kernel" -p no:cacheprovider
TAIL=10 step chain 60 python3 bench/gemv_chain.py --out $W/chain --rows 1,2,3,4 --passes 0
