#!/usr/bin/env bash
# Session 8, call 4: MTP with the drafting rule (auto_disable, 20b0b0d): bench spec at batch 1 for k = 1, 2, 3 (forced
# acceptance curves with and without the rule), then k = 2 at batches 8 and 64.
set -uo pipefail
: "${OUT:?}"
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1 || exit 1
export PYTHONUNBUFFERED=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton CE_NO_SHRINK=1
export PYTHONPATH=$PWD:/tmp/site
cat .cecache/compile-cache.tgz.* | tar xzf - -C /tmp 2>/dev/null
W=$(mktemp -d /tmp/call4.XXXXXX)
step() {  # step NAME LIMIT CMD...
  local name=$1 limit=$2; shift 2
  local left=$(( 420 - ($(date +%s) - T0) )); (( limit > left )) && limit=$left
  (( limit < 30 )) && { echo "$name skipped"; return; }
  echo "$name (limit $limit) at +$(( $(date +%s) - T0 ))s"
  timeout --signal=INT --kill-after=10 "$limit" "$@" >"$W/$name.log" 2>&1
  echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"
}
step spec 200 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=1,2,3 --out "$W/spec"
grep -vE "^\s*$" "$W/spec.log" | grep -v "Warning\|_warn_once\|loading weights" | grep -v "^                   " | tail -n 24
step spec_batch 220 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 64 --max-model-len 512 -p spec.batches=8,64 -p spec.ks=2 --out "$W/spec_batch"
grep -vE "^\s*$" "$W/spec_batch.log" | grep -v "Warning\|_warn_once\|loading weights" | grep -v "^                   " | tail -n 24
for f in spec/spec.json spec_batch/spec.json; do cp "$W/$f" "$OUT/$(echo $f | tr / _)" 2>/dev/null; done
tar czf "$OUT/call4.tgz" -C "$W" . ; ls "$OUT"; echo "script end at +$(( $(date +%s) - T0 ))s"
