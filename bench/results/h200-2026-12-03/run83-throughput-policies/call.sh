#!/bin/bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
export COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
mkdir -p $OUT/r
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout --signal=INT $limit "$@" > $OUT/r/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n ${TAIL:-25} $OUT/r/$name.log; }

TAIL=40 step profile_512 300 python3 -m bench step_profile --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-model-len 9216 --max-num-seqs 512 -p step_profile.batches=1,16,512 -p step_profile.context=8192 -p step_profile.steps=8 -p step_profile.prefill_seqs=2 -p step_profile.prefill_len=8192 --out $OUT/r/profile_512
TAIL=14 step throughput_mixed 170 python3 -m bench throughput --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096 --out $OUT/r/throughput_mixed
TAIL=14 step throughput_prefill_first 90 python3 -m bench throughput --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096 --no-mixed-steps --out $OUT/r/throughput_prefill_first
cd $OUT && tar czf r.tgz r && rm -rf r
