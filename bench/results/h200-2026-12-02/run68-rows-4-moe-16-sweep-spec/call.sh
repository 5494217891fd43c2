#!/usr/bin/env bash
# Session 8, call 2: SKINNY_MAX_ROWS 4 and MOE_GEMV_MAX_TOKENS 16 (from call 1): the linear + MoE GPU tests; the chain's
# descent at 3-4 rows and the rule at 5-8 rows (profiled); the MoE crossover past 16; the 0.8B latency and sweep at
# 1-32 rows; MTP k = 2, 3 at batch 1 (3-4-row verifies now on the few-rows GEMV); k = 1 at 8K context.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONUNBUFFERED=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton CE_NO_SHRINK=1
export PYTHONPATH=$PWD:/tmp/site
cat .cecache/compile-cache.tgz.* | tar xzf - -C /tmp 2>/dev/null
W=$(mktemp -d /tmp/call2.XXXXXX)
step() {  # step NAME LIMIT CMD...
  local name=$1 limit=$2; shift 2
  local left=$(( 580 - ($(date +%s) - T0) )); (( limit > left )) && limit=$left
  (( limit < 30 )) && { echo "$name skipped"; return; }
  echo "$name (limit $limit) at +$(( $(date +%s) - T0 ))s"
  timeout --signal=INT --kill-after=10 "$limit" "$@" >"$W/$name.log" 2>&1
  echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"
}
step tests 150 python3 -m pytest -q -n 6 -rf -m gpu tests/test_moe_ops.py tests/test_kernels_cuda.py tests/test_speculative.py -k "moe or linear or skinny or gemv or verify or speculative or spec" -p no:cacheprovider
grep -E "FAILED|passed|failed|error" "$W/tests.log" | tail -n 8
step chain_hi 40 python3 bench/gemv_chain.py --rows 5,6,8 --passes 0 --profile --out "$W/chain_hi"
grep -E "^M=|rows|^ +[0-9]" "$W/chain_hi.log" | grep -v "critical\|µs charged\|    [0-9.]* µs  x" | tail -n 12
grep -A7 "M=8  rule" "$W/chain_hi.log" | head -n 8
step moe_micro 40 python3 bench/moe_microbench.py --tokens "" --routed-tokens 16,24,32 --out "$W/moe_micro"
python3 -c "
import json
for r in json.load(open('$W/moe_micro/moe_microbench.json'))['rows']:
    print(r['tokens'], r['path'], r.get('rule'), round(r.get('us',0),1), r.get('error','')[:100])
" 2>&1 | head -n 10
step b08 200 python3 -m bench latency,sweep --model qwen3.5-0.8b --device cuda --dtype bfloat16 -p latency.repeats=1 -p sweep.batches=1,2,3,4,8,16,32 -p sweep.prompt_len=512 --max-num-seqs 32 --max-model-len 1024 --out "$W/b08"
grep -vE "^\s*$" "$W/b08.log" | grep -v "loading weights\|Warning\|_warn_once" | tail -n 30
step spec 130 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2,3 --out "$W/spec"
grep -vE "^\s*$" "$W/spec.log" | grep -v "Warning\|_warn_once\|loading weights" | grep -v "^                   " | tail -n 20
step spec_long 100 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 8704 -p spec.batches=1 -p spec.ks=1 -p spec.prompt_len=8192 --out "$W/spec_long"
grep -vE "^\s*$" "$W/spec_long.log" | grep -v "Warning\|_warn_once\|loading weights" | tail -n 30
step chain_lo 200 python3 bench/gemv_chain.py --rows 3,4 --passes 1 --out "$W/chain_lo"
grep -vE "^\s*$" "$W/chain_lo.log" | tail -n 12
for f in b08/latency.json b08/sweep.json spec/spec.json spec_long/spec.json chain_hi/gemv_chain.json chain_lo/gemv_chain.json moe_micro/moe_microbench.json; do cp "$W/$f" "$OUT/$(echo $f | tr / _)" 2>/dev/null; done
tar czf "$OUT/call2.tgz" -C "$W" . ; ls "$OUT"; echo "script end at +$(( $(date +%s) - T0 ))s"
