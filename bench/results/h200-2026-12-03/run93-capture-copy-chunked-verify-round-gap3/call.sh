#!/bin/bash
# Session 15, call 1: last session's unmeasured work. GPU tests of the chunked verify (74d2586) and the round's
# host-visible results (9cca4c6); the verify's chunked rows against the walk (B 1-128, G = 1) and the G = 2 kernels;
# a round through the runtime's own path (round_gap3.py) against run 92's wall.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
export COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
R=/tmp/r; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout --signal=INT $limit "$@" > $R/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n ${TAIL:-25} $R/$name.log
  (cd /tmp && tar czf $OUT/r.tgz r); }
SKIP=store_kv,paged_attention_decode,paged_attention_prefill,causal_conv1d_prefill,causal_conv1d_decode,gated_delta_rule_prefill,gated_delta_rule_decode,linear,FLA,gated_deltanet_commit,sweep
TAIL=4 step capture_copy 40 python3 .wt/capture_copy.py
TAIL=6 step verify_tests 90 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_cuda.py -k "gated_deltanet_verify"
TAIL=30 step ops_verify 80 python3 bench/ops_microbench.py --out $R/ops_verify --batches 1,8,16,64,128 --no-baseline --skip $SKIP,gated_deltanet_decode
TAIL=6 step spec_tests 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_speculative.py
TAIL=6 step round_gap3 270 python3 .wt/round_gap3.py
TAIL=40 step ops_g2 75 python3 bench/ops_microbench.py --out $R/ops_g2 --linear-v-heads 32 --batches 1,8,16,64 --no-baseline --skip $SKIP
