#!/bin/bash
# Session 13, call 5: the verify kernel with each position's loads issued before the previous position's stores.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
export COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
R=/tmp/r; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout --signal=INT $limit "$@" > $R/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n ${TAIL:-25} $R/$name.log
  (cd /tmp && tar czf $OUT/r.tgz r); }
TAIL=40 step ops_verify 60 python3 bench/ops_microbench.py --out $R/ops_verify --batches 1,8,16,64,128 --no-baseline --skip store_kv,paged_attention_decode,paged_attention_prefill,causal_conv1d_prefill,causal_conv1d_decode,gated_delta_rule_prefill,gated_delta_rule_decode,gated_deltanet_decode,linear,FLA,gated_deltanet_commit,sweep
TAIL=6 step verify_tests 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_cuda.py -k "gated_deltanet_verify"
