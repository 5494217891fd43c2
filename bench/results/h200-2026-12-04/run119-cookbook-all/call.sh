#!/bin/bash
# Session 21, call 3: the attention op's GPU tests (the early loads at batch 1 / 4), then the whole cookbook (c1, c16,
# c64, c256, c1024) from one 512-slot engine, prefill first (run 113's engine). (The first try, with Nsight Compute on
# the attention op after it, was taken back mid-run and returned nothing: 271 s of the budget; the ncu step is cut.)
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run119; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run119.tgz -C $W .; }
TAIL=6 step tests 100 python3 -m pytest -q tests/test_kernels_cuda.py -k "attention_decode" -p no:cacheprovider
TAIL=30 step cookbook 380 python3 -m bench cookbook --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-model-len 9216 \
  --max-num-seqs 512 --no-mixed-steps -p cookbook.concurrency=1,16,64,256,1024 --out $W/cookbook
python3 -c "
import json; d=json.load(open('$W/cookbook/cookbook.json'))
for c in d['cells']:
    print(c['concurrency'], c['requests'], 'TPOT p50/p99', [round(c['tpot_ms'][q], 3) for q in ('p50', 'p99')], 'TTFT p50/p99', [round(c['ttft_ms'][q], 1) for q in ('p50', 'p99')], 'tok/s', round(c['total_tok_s']), round(c['output_tok_s']), 'wall', round(c.get('wall_s', 0), 1))" 2>&1 | tail -6
tar czf $OUT/run119.tgz -C $W .
