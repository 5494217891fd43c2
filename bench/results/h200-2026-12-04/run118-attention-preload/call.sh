#!/bin/bash
# Session 21, call 2: ce::attention_decode with the step's inputs and the first key tile read before the PDL wait
# (PRELOAD 1: block ids before the wait, keys/values right after it; 2: keys/values before it too; 0: as before):
# the op alone (20 calls a graph) and the decode graph's critical path at batch 1 / 4 / 16 (context 512, tables
# 8,300 tokens wide as the sweep's engine: 64 splits at batch 1).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run118; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run118.tgz -C $W .; }
TAIL=24 step sweep 120 python3 bench/attention_decode_sweep.py --out $W/sweep --preloads 0,1,2 \
  --cases 1x512x8300,1x512,8x512x8300,16x512x8300,1x8192x9216,16x8192x9216
for m in 0 2 1; do
  CE_ATTENTION_PRELOAD=$m TAIL=14 step paths_p$m 170 python3 bench/step_paths.py --batches 1,4,16 --context 512 --max-model-len 8300 --top 8 --out $W/paths_p$m
done
