#!/bin/bash
# Session 22, call 2: ce::add_rms_norm_linear with the norm as a kernel of its own from 2 rows (NORM_APART_MIN_ROWS):
# its GPU tests; the chain at 1-4 rows (is one row better apart too?); the decode graph's critical path at batch
# 1 / 2 / 4 (context 512; run 117: 0.719 / 0.866 / 1.052 ms); bench spec at batch 1, k = 2, forced 0 / 0.8 (run 110:
# verify graph 1,124 µs = 1.61 decode graphs, forced 0.8 1.26x).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run122; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run122.tgz -C $W .; }
TAIL=4 step tests 100 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "add_rms_norm_linear or linear_on or opcheck_on_cuda or runs_our_kernel" -p no:cacheprovider
TAIL=16 step chain 70 python3 bench/gemv_chain.py --out $W/chain --rows 1,2,3,4 --passes 0
TAIL=16 step paths 170 python3 bench/step_paths.py --batches 1,2,4 --context 512 --top 10 --out $W/paths
TAIL=10 step spec 230 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 8 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 --out $W/spec
