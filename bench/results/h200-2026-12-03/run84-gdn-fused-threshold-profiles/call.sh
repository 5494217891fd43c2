#!/bin/bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
export COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
mkdir -p $OUT/r
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout --signal=INT $limit "$@" > $OUT/r/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n ${TAIL:-25} $OUT/r/$name.log; }

TAIL=60 step ops_gdn 150 python3 bench/ops_microbench.py --out $OUT/r/ops_gdn --batches 1,8,12,16,24,32 --no-baseline --skip store_kv,paged_attention_decode,paged_attention_prefill,causal_conv1d_prefill,gated_delta_rule_prefill,linear,FLA,gated_deltanet_commit,sweep
PROF=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-model-len 9216 --max-num-seqs 16 -p step_profile.batches=1,8,16 -p step_profile.context=8192 -p step_profile.steps=16 -p step_profile.prefill_seqs=1 -p step_profile.prefill_len=8192)
TAIL=45 step profile_16 200 python3 -m bench step_profile "${PROF[@]}" --out $OUT/r/profile_16
TAIL=45 step profile_16_fused8 120 python3 .wt/fused.py 8 step_profile "${PROF[@]}" --out $OUT/r/profile_16_fused8
TAIL=45 step profile_256 180 python3 -m bench step_profile --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-model-len 4096 --max-num-seqs 256 -p step_profile.batches=64,256 -p step_profile.context=1024 -p step_profile.steps=8 -p step_profile.prefill_seqs=16 -p step_profile.prefill_len=512 --out $OUT/r/profile_256
cd $OUT && tar czf r.tgz r && rm -rf r
