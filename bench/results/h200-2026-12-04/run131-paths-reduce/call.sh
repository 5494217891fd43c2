#!/bin/bash
# Session 23, call 7: the decode graph at context 8,192 in 9,216-wide tables (c1's and c16's steps) after the reduce
# kernel's gate load moved ahead of the merge (run 128, before it: batch 1 0.756 ms, reduce charged 22.7 µs; run 121,
# batch 16 before both attention changes: 1.724 ms, attention 463.6 + reduce 20.4).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run131; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run131.tgz -C $W .; }
TAIL=24 step paths 300 python3 bench/step_paths.py --batches 1,16 --context 8192 --max-model-len 9216 --top 12 --out $W/paths
