#!/bin/bash
# Session 23, call 1: the 97-matmul chain at 16 and 8 rows with every role on the tensor-core loop (the norm apart,
# ce::add_rms_norm, as ce::linear runs it from two rows; down's SiLU gate in the loop's prologue), the weight's rows or
# x's as the mma's M side, against cuBLAS (what ce::linear runs there), then one descent pass over the tensor-core
# tiles (and at 8 rows the few-rows GEMV's).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run125; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run125.tgz -C $W .; }
TAIL=25 step chain16 270 python3 bench/gemv_chain.py --out $W/chain16 --rows 16 --passes 1 --dot
TAIL=25 step chain8 270 python3 bench/gemv_chain.py --out $W/chain8 --rows 8 --passes 1 --dot
