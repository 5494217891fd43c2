#!/bin/bash
# Session 20, call 2: the c1024 cell (run 82's command: 512 slots, prefill first) with the block tables kept by slot
# (pack_step gathers the step's rows from one array instead of converting 512 lists of ~520 blocks a step).
# Predicted: decode steps near their GPU time (run 112: GPU 19.5 ms, host 17.4 ms at 512 x 8,192 unoverlapped;
# run 82's ITL p50 21.8 ms, mean 32.9 ms), throughput >= 125,000 tok/s, TPOT p50 <= 28 ms.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run113; mkdir -p $W
T0=$(date +%s)
timeout --signal=INT 400 python3 -m bench cookbook --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-model-len 9216 \
  --max-num-seqs 512 --no-mixed-steps -p cookbook.concurrency=1024 --out $W/c1024 > $W/c1024.log 2>&1
echo "c1024: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "loading|Warn|warn" $W/c1024.log | tail -6
python3 -c "
import json; c=json.load(open('$W/c1024/cookbook.json'))['cells'][0]
print({k: c[k] for k in ('wall_s','engine_steps','step_kinds','preemptions')}, 'itl', {k: round(v, 2) for k, v in c['itl_ms'].items()})" 2>&1 | tail -2
tar czf $OUT/run113.tgz -C $W .
