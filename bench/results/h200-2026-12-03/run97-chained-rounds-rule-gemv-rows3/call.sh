#!/bin/bash
# Session 16, call 3: chained rounds (the next argmax round launched from the device's results before the host reads
# a round back) checked on the GPU (compiled, captured rounds == eager, chained included) and timed in bench spec at
# batch 1 / 8 (its `mtp` row chains, acceptance 0; `forced_0` does not: the A/B in one run), with the drafting rule's
# pooled acceptance; then the few-rows GEMV's descent at 3 and 4 rows and bench spec with its 3-row tiles.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
export COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
R=/tmp/r; mkdir -p $R
step() { local name=$1 limit=$2; shift 2; local t0=$(date +%s)
  timeout --signal=INT $limit "$@" > $R/$name.log 2>&1; local rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - t0 ))s"; tail -n ${TAIL:-25} $R/$name.log
  (cd /tmp && tar czf $OUT/r.tgz r); }
TAIL=8 step spec_gpu_test 200 python3 -m pytest -q -p no:cacheprovider tests/test_speculative.py -k test_cuda_graph_rounds_equal_eager_on_gpu
SPEC=(spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 8 --max-model-len 512 -p spec.batches=1,8 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768)
TAIL=16 step spec 250 python3 -m bench "${SPEC[@]}" --out $R/spec
TAIL=30 step gemv_chain 120 python3 bench/gemv_chain.py --out $R/gemv_chain --rows 3 --passes 1
