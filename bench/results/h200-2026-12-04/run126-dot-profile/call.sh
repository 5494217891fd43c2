#!/bin/bash
# Session 23, call 2: where the tensor-core chain's ~2.1 ms at 16 rows goes (run 125): the chain's critical path by
# kernel for cuBLAS and both tensor-core starts.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run126; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run126.tgz -C $W .; }
TAIL=60 step chain16 200 python3 bench/gemv_chain.py --out $W/chain16 --rows 16 --passes 0 --profile
