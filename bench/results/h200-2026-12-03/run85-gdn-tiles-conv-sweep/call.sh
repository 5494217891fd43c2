#!/bin/bash
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
export COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
R=/tmp/r; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout --signal=INT $limit "$@" > $R/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n ${TAIL:-25} $R/$name.log
  (cd /tmp && tar czf $OUT/r.tgz r); }
SW=$R/conv_sweep/conv_decode_sweep.json
TAIL=12 step conv_sweep 100 python3 bench/conv_decode_sweep.py --out $R/conv_sweep --batches 32,64,128,256,512
TAIL=8 step gdn_tests 100 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_cuda.py -k "gated_deltanet_decode"
TAIL=30 step ops_gdn 80 python3 bench/ops_microbench.py --out $R/ops_gdn --batches 16,32,64,128,256,512 --no-baseline --skip store_kv,paged_attention_decode,paged_attention_prefill,causal_conv1d_prefill,gated_delta_rule_prefill,linear,FLA,gated_deltanet_commit,gated_deltanet_verify,sweep
TP=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096)
TAIL=3 step throughput 170 python3 -m bench throughput "${TP[@]}" --out $R/throughput
TAIL=3 step throughput_gdn 50 python3 .wt/gdn_rule.py $R/ops_gdn/ops_microbench.json throughput "${TP[@]}" --out $R/throughput_gdn
TAIL=3 step throughput_conv 50 python3 .wt/conv_rule.py $SW throughput "${TP[@]}" --out $R/throughput_conv
TAIL=3 step throughput_again 45 python3 -m bench throughput "${TP[@]}" --out $R/throughput_again
TAIL=3 step throughput_gdn_again 45 python3 .wt/gdn_rule.py $R/ops_gdn/ops_microbench.json throughput "${TP[@]}" --out $R/throughput_gdn_again
