#!/bin/bash
# Session 25, call 4: the cookbook's c1 and c16 and the sweep at batch 1-16 on one 16-slot engine after the GDN
# decode's 9-16 entry changed to tiles of 32 with the prefetch (run 136: c1 TPOT 0.752, c16 TPOT 1.82 / ITL 1.62 ms;
# sweep b16 39.6% at context 549, 54.6% at 8,229).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run142; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run142.tgz -C $W .; }
TAIL=30 step bench 440 python3 -m bench cookbook,sweep --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-model-len 9216 \
  --max-num-seqs 16 --no-mixed-steps -p cookbook.concurrency=1,16 -p sweep.batches=1,2,4,8,16 --out $W/bench
