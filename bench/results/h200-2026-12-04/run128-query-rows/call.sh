#!/bin/bash
# Session 23, call 4: ce::attention_decode with its query tile at the GQA group's 4 rows instead of 16: the GPU tests;
# the op alone, 16 rows against 4, at c1's, c16's and the sweep's shapes; the decode graph at batch 1 (context 8,192 in
# 9,216-wide tables: c1's step) and batch 1 / 4 / 16 at context 512 (8,300-wide tables: the sweep's step; run 118:
# 693.6 / 1,037.1 / 1,357.9 µs, attention charged 38.0 / 46.1 / 106.0).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run128; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run128.tgz -C $W .; }
TAIL=4 step tests 150 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "attention_decode" -p no:cacheprovider
TAIL=45 step op 120 python3 bench/attention_decode_sweep.py --query-rows --out $W/op --cases 1x512x8300,1x8192x9216,4x8192x9216,16x512x8300,16x8192x9216,64x8192
TAIL=14 step paths_c1 160 python3 bench/step_paths.py --batches 1 --context 8192 --max-model-len 9216 --top 8 --out $W/paths_c1
TAIL=20 step paths512 170 python3 bench/step_paths.py --batches 1,4,16 --context 512 --max-model-len 8300 --top 8 --out $W/paths512
