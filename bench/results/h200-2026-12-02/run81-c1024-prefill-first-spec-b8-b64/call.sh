#!/bin/bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
export COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
mkdir -p $OUT/r
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout --signal=INT $limit "$@" > $OUT/r/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n ${TAIL:-25} $OUT/r/$name.log; }

TAIL=12 step c1024_prefill_first 300 python3 -m bench cookbook --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-model-len 9216 --max-num-seqs 1024 --no-mixed-steps -p cookbook.concurrency=1024 --out $OUT/r/c1024_prefill_first
TAIL=40 step spec_b8_b64 270 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 64 --max-model-len 512 -p spec.batches=8,64 -p spec.ks=2 --out $OUT/r/spec_b8_b64
cd $OUT && tar czf r.tgz r && rm -rf r
