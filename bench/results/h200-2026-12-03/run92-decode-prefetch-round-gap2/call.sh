#!/bin/bash
# Session 14, call 3: the decode kernel's tile prefetch (34be8b8): GPU tests, one call per graph with and without it;
# a round's host pieces, finer (round_gap2.py).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
export COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
R=/tmp/r; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout --signal=INT $limit "$@" > $R/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n ${TAIL:-25} $R/$name.log
  (cd /tmp && tar czf $OUT/r.tgz r); }
TAIL=4 step decode_tests 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_cuda.py -k "gated_deltanet_decode"
TAIL=34 step ops_decode 90 python3 bench/ops_microbench.py --out $R/ops_decode --batches 1,8,16,32,64 --no-baseline --skip store_kv,paged_attention_decode,paged_attention_prefill,causal_conv1d_prefill,causal_conv1d_decode,gated_delta_rule_prefill,gated_delta_rule_decode,linear,FLA,gated_deltanet_commit,gated_deltanet_verify,sweep
TAIL=4 step round_gap2 360 python3 .wt/round_gap2.py
