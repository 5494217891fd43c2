#!/bin/bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
export COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
mkdir -p $OUT/r
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout --signal=INT $limit "$@" > $OUT/r/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n ${TAIL:-25} $OUT/r/$name.log; }
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
TAIL=30 step gemv_chain 150 python3 bench/gemv_chain.py --out $OUT/r/gemv_chain --rows 4,5,8,16 --passes 0
TAIL=60 step prompt_cookbook 330 python3 -m bench step_profile,cookbook --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-model-len 9216 --max-num-seqs 16 -p step_profile.batches=1,16 -p step_profile.context=8192 -p step_profile.steps=5 -p step_profile.prefill_seqs=1 -p step_profile.prefill_len=8192 -p cookbook.concurrency=1,16 --out $OUT/r/prompt_cookbook
cd $OUT && tar czf r.tgz r && rm -rf r
