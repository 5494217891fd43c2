#!/bin/bash
# Session 15, call 2: the captured rounds copying their staging buffer themselves (82364c8) checked on the GPU
# (compiled rounds == eager, greedy / oracle / sampled); then bench spec at batch 1 and 8, k = 2.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
export COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
R=/tmp/r; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout --signal=INT $limit "$@" > $R/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n ${TAIL:-25} $R/$name.log
  (cd /tmp && tar czf $OUT/r.tgz r); }
TAIL=6 step spec_gpu_test 240 python3 -m pytest -q -p no:cacheprovider tests/test_speculative.py -k test_cuda_graph_rounds_equal_eager_on_gpu
SPEC=(spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 8 --max-model-len 512 -p spec.batches=1,8 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10)
TAIL=40 step spec 330 python3 -m bench "${SPEC[@]}" --out $R/spec
