#!/usr/bin/env bash
# Session 8, call 1: GPU tests of fma_runs, MoE GEMVs to 8 tokens, the verify attention op; the matmul chain at 1-4 rows;
# the MoE crossover; MTP k = 1, 2 at batch 1 (verify op, round critical paths).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONUNBUFFERED=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton CE_NO_SHRINK=1
export PYTHONPATH=$PWD:/tmp/site
cat .cecache/compile-cache.tgz.* | tar xzf - -C /tmp 2>/dev/null
W=$(mktemp -d /tmp/call1.XXXXXX)
step() {  # step NAME LIMIT CMD...
  local name=$1 limit=$2; shift 2
  local left=$(( 575 - ($(date +%s) - T0) )); (( limit > left )) && limit=$left
  (( limit < 30 )) && { echo "$name skipped"; return; }
  echo "$name (limit $limit) at +$(( $(date +%s) - T0 ))s"
  timeout --signal=INT --kill-after=10 "$limit" "$@" >"$W/$name.log" 2>&1
  echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"
}
step tests 170 python3 -m pytest -q -n 6 -rf -m gpu tests/test_moe_ops.py tests/test_moe_model.py tests/test_kernels_cuda.py -k "moe or linear or skinny or gemv or verify" -p no:cacheprovider
grep -E "FAILED|passed|failed" "$W/tests.log" | tail -n 8
step gemv_chain 90 python3 bench/gemv_chain.py --rows 1,2,3,4 --passes 0 --profile --out "$W/gemv_chain"
grep -vE "^\s*$" "$W/gemv_chain.log" | tail -n 60
step moe_micro 60 python3 bench/moe_microbench.py --tokens "" --routed-tokens 1,4,8,12,16 --out "$W/moe_micro"
python3 -c "
import json
for r in json.load(open('$W/moe_micro/moe_microbench.json'))['rows']:
    print(r['tokens'], r['path'], r.get('rule'), round(r.get('us',0),1), r.get('error','')[:100])
" 2>&1 | head -n 20
step spec 600 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=1,2 --out "$W/spec"
grep -vE "^\s*$" "$W/spec.log" | grep -v "Warning\|_warn_once\|loading weights" | tail -n 80
for f in spec/spec.json moe_micro/moe_microbench.json gemv_chain/gemv_chain.json; do cp "$W/$f" "$OUT/$(echo $f | tr / _)" 2>/dev/null; done
tar czf "$OUT/call1.tgz" -C "$W" . ; ls "$OUT"; echo "script end at +$(( $(date +%s) - T0 ))s"
