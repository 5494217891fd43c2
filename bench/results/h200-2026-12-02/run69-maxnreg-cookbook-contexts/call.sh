#!/usr/bin/env bash
# Session 8, call 3: the 4-row wide GEMV capped at 128 registers (one wave for in_proj): linear GPU tests, the chain at
# 3-4 rows (profiled); the serving envelope at 8,192 in / 1,024 out: cookbook c1 / c16, the sweep at contexts 512 and
# 8,192 (batches 1-16) and where a batch-16 step at context 8,192 spends its time (step_profile).
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONUNBUFFERED=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton CE_NO_SHRINK=1
export PYTHONPATH=$PWD:/tmp/site
cat .cecache/compile-cache.tgz.* | tar xzf - -C /tmp 2>/dev/null
W=$(mktemp -d /tmp/call3.XXXXXX)
step() {  # step NAME LIMIT CMD...
  local name=$1 limit=$2; shift 2
  local left=$(( 570 - ($(date +%s) - T0) )); (( limit > left )) && limit=$left
  (( limit < 30 )) && { echo "$name skipped"; return; }
  echo "$name (limit $limit) at +$(( $(date +%s) - T0 ))s"
  timeout --signal=INT --kill-after=10 "$limit" "$@" >"$W/$name.log" 2>&1
  echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"
}
step tests 110 python3 -m pytest -q -n 6 -rf -m gpu tests/test_kernels_cuda.py -k "linear or skinny or gemv" -p no:cacheprovider
grep -E "FAILED|passed|failed|error" "$W/tests.log" | tail -n 6
step chain 40 python3 bench/gemv_chain.py --rows 3,4 --passes 0 --profile --out "$W/chain"
grep -vE "^\s*$" "$W/chain.log" | grep -A7 "rule   " | head -n 18; grep -A4 "^rows" "$W/chain.log"
E=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-model-len 9216 --max-num-seqs 16)
step cookbook 200 python3 -m bench cookbook "${E[@]}" -p cookbook.concurrency=1,16 --out "$W/cookbook"
grep -vE "^\s*$" "$W/cookbook.log" | grep -v "loading weights\|Warning\|_warn_once" | tail -n 16
step sweep 120 python3 -m bench sweep "${E[@]}" -p sweep.batches=1,2,3,4,8,16 -p sweep.prompt_len=512,8192 --out "$W/sweep"
grep -vE "^\s*$" "$W/sweep.log" | grep -v "loading weights\|Warning\|_warn_once" | tail -n 16
step profile 90 python3 -m bench step_profile "${E[@]}" -p step_profile.batches=16 -p step_profile.context=8192 -p step_profile.steps=10 --out "$W/profile"
grep -vE "^\s*$" "$W/profile.log" | grep -v "loading weights\|Warning\|_warn_once" | tail -n 40
for f in chain/gemv_chain.json cookbook/cookbook.json sweep/sweep.json profile/step_profile.json; do cp "$W/$f" "$OUT/$(echo $f | tr / _)" 2>/dev/null; done
tar czf "$OUT/call3.tgz" -C "$W" . ; ls "$OUT"; echo "script end at +$(( $(date +%s) - T0 ))s"
