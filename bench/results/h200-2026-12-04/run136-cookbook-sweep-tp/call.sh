#!/bin/bash
# Session 24, call 3: after the GDN decode rule took the V tiles of 32 over programs up to 4 sequences (run 135: the
# batch-4 graph at context 8,192 1.076 -> 1.045 ms) and the large-batch rule the walked tiles of 32 up to 256 (run
# 133): one 16-slot engine (9,216-token tables, prefill first) for the cookbook's c1 and c16 cells and the sweep at
# batch 1-16, contexts 512 and 8,192 (run 129), then the throughput workload (run 114: 32,301 output tok/s).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run136; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run136.tgz -C $W .; }
TAIL=30 step bench 340 python3 -m bench cookbook,sweep --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-model-len 9216 \
  --max-num-seqs 16 --no-mixed-steps -p cookbook.concurrency=1,16 -p sweep.batches=1,2,4,8,16 --out $W/bench
python3 -c "
import json; d=json.load(open('$W/bench/cookbook.json'))
for c in d['cells']:
    print(c['concurrency'], c['requests'], 'TPOT p50/p99', [round(c['tpot_ms'][q], 3) for q in ('p50', 'p99')], 'TTFT p50/p99', [round(c['ttft_ms'][q], 1) for q in ('p50', 'p99')], 'ITL p50', round(c['itl_ms']['p50'], 3), 'tok/s', round(c['total_tok_s']), round(c['output_tok_s']))" 2>&1 | tail -4
TAIL=6 step tp 240 python3 -m bench throughput --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096 --out $W/tp
