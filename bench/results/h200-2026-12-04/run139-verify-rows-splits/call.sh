#!/bin/bash
# Session 25, call 1: what session 24 built without a GPU. The GPU tests of the verify's attention by rows
# (ROWS_PER_SEQ, live in every verify) and of the reduce's chunked merge past 64 splits; the attention op alone at
# 64 / 128 / 256 splits at 1-4 x 8,192 (9,216-wide tables); then the batch-1 decode graph at context 8,192 with the
# split ceiling at 128 against 64 (run 135: 0.752 ms, attention 91.9 + reduce 23.3 µs a step).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run139; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run139.tgz -C $W .; }
TAIL=12 step tests 150 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k "past_a_merge_chunk or paged_attention_verify or paged_attention_decode" -p no:cacheprovider
TAIL=30 step sweep 90 python3 bench/attention_decode_sweep.py --cases 1x8192x9216,2x8192x9216,4x8192x9216 --splits 64,128,256 --out $W/sweep
TAIL=16 step paths_s128 190 python3 bench/step_paths.py --batches 1 --context 8192 --max-model-len 9216 --top 8 --max-splits 128 --out $W/paths_s128
TAIL=16 step paths_s64 150 python3 bench/step_paths.py --batches 1 --context 8192 --max-model-len 9216 --top 8 --out $W/paths_s64
