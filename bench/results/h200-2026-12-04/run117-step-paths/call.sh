#!/bin/bash
# Session 21, call 1: the decode graph's critical path at batch 1-16 (which kernels grow with the batch), and the GPU
# test of the compiled verify round packing its block tables from the slot array (fb31df5).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run117; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run117.tgz -C $W .; }
step paths512 230 python3 bench/step_paths.py --batches 1,2,4,8,16 --context 512 --out $W/paths512
TAIL=12 step verify_gpu 200 python3 -m pytest -q -m gpu tests/test_speculative.py -k test_cuda_graph_rounds_equal_eager_on_gpu -p no:cacheprovider
step paths8192 140 python3 bench/step_paths.py --batches 1,16 --context 8192 --out $W/paths8192
