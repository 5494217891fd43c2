#!/bin/bash
# Session 13, call 1: the engine-level A/B of DECODE_LAUNCHES (run 85 measured it one call per graph only).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
export COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
R=/tmp/r; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout --signal=INT $limit "$@" > $R/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n ${TAIL:-25} $R/$name.log
  (cd /tmp && tar czf $OUT/r.tgz r); }
WITH=(python3 -c "import ast, runpy, sys, ops.triton.gated_deltanet_kernels as g
g.DECODE_LAUNCHES = ast.literal_eval(sys.argv[1])
sys.argv = ['bench', *sys.argv[2:]]
runpy.run_module('bench', run_name='__main__')")
B=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096)
AB=(sweep,throughput "${B[@]}" -p sweep.batches=8,16,32,64,128 -p sweep.prompt_len=512)
TAIL=30 step gdn_launches 230 python3 -m bench "${AB[@]}" --out $R/gdn_launches
TAIL=30 step gdn_launches_before 110 "${WITH[@]}" "((16, None, 8),)" "${AB[@]}" --out $R/gdn_launches_before
TAIL=20 step latency 80 python3 -m bench latency -p latency.repeats=2 "${B[@]}" --out $R/latency
TAIL=20 step latency_gdn_tiles 80 "${WITH[@]}" "((16, 64, 8), (64, 32, 4))" latency -p latency.repeats=2 "${B[@]}" --out $R/latency_gdn_tiles
