#!/bin/bash
# Session 14, call 1: GPU tests of the decode kernel's one-round-trip tiled norm (1637436), its microbench rows,
# and bench spec on the loads-first verify kernel + host-packed rounds (5e544d8, 94053ea).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
export COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
R=/tmp/r; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout --signal=INT $limit "$@" > $R/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n ${TAIL:-25} $R/$name.log
  (cd /tmp && tar czf $OUT/r.tgz r); }
TAIL=8 step decode_tests 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_cuda.py -k "gated_deltanet_decode"
TAIL=30 step ops_decode 90 python3 bench/ops_microbench.py --out $R/ops_decode --batches 1,8,16,32,64 --no-baseline --skip store_kv,paged_attention_decode,paged_attention_prefill,causal_conv1d_prefill,causal_conv1d_decode,gated_delta_rule_prefill,gated_delta_rule_decode,linear,FLA,gated_deltanet_commit,gated_deltanet_verify,sweep
SPEC=(spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 64 --max-model-len 512 -p spec.batches=1,8,64 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10)
TAIL=45 step spec 300 python3 -m bench "${SPEC[@]}" --out $R/spec
