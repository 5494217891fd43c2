#!/bin/bash
# Session 25, call 5 (run 138 again, on a warm machine): the cookbook's c16 cell (and c1) on a 16-slot engine with a prompt step of 131,072 tokens, so
# that the 16 prompts of a wave are computed in one step and no request's decode waits through later prompt steps
# (run 142, 16,384-token steps: TTFT p50 254 ms, TPOT p50 1.79 ms, ITL p50 1.59; SGLang 0.5.16: 454 ms, 1.47 ms).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run143; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run143.tgz -C $W .; }
TAIL=12 step bench 540 python3 -m bench cookbook --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-model-len 9216 \
  --max-num-seqs 16 --no-mixed-steps --max-num-batched-tokens 131072 -p cookbook.concurrency=1,16 --out $W/bench
python3 -c "
import json; d=json.load(open('$W/bench/cookbook.json'))
for c in d['cells']:
    print(c['concurrency'], c['requests'], 'TPOT p50/p99', [round(c['tpot_ms'][q], 3) for q in ('p50', 'p99')], 'TTFT p50/p99', [round(c['ttft_ms'][q], 1) for q in ('p50', 'p99')], 'ITL p50', round(c['itl_ms']['p50'], 3), 'tok/s', round(c['total_tok_s']), round(c['output_tok_s']))" 2>&1 | tail -4
tar czf $OUT/run143.tgz -C $W .
