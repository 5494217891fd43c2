#!/bin/bash
# Session 23, call 6: the GPU tests session 22's review added and never ran (which kernels ce::add_rms_norm_linear
# runs, its one-row opcheck) with the other opcheck / kernel-path tests; then the matmul chain at 3 and 4 rows (a
# batch-1 verify at k = 2 or 3; decode batches 3-4) with one descent pass over the GEMV and tensor-core tiles, now that
# the norm runs apart from two rows (run 108's tensor-core loop paid the norm in every program).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run130; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run130.tgz -C $W .; }
TAIL=6 step tests 200 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "add_rms_norm_linear or opcheck_on_cuda or runs_our_kernel" -p no:cacheprovider
TAIL=24 step chain34 300 python3 bench/gemv_chain.py --out $W/chain34 --rows 3,4 --passes 1 --dot
grep -E "^M=. (start|after|best)" $W/chain34.log
