#!/bin/bash
# Session 19, call 3: run 108's tensor-core loop lost on every role at its first candidates (dot wide + rule narrow
# +53 µs a step at 3-4 rows). Here the coordinate descent at 3 and 4 rows (`--passes 1 --dot`), from the rule, tries
# every role's GEMV and tensor-core candidates: whether any tile of the tensor-core loop beats the rule on any role.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run109; mkdir -p $W
timeout --signal=INT 480 python3 bench/gemv_chain.py --rows 3,4 --passes 1 --dot --out $W/chain > $W/chain.log 2>&1
echo "gemv_chain: exit $?"; grep -E "^M=" $W/chain.log | cut -c1-150
tar czf $OUT/run109.tgz -C $W .
