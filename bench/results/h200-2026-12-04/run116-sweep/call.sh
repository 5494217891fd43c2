#!/bin/bash
# Session 20, call 5: the whole sweep (batch 1-256, contexts 512 and 8,192, one 256-slot engine) with the fixed
# measurement (prompts prefill first, tokens counted over the timed window: 08aaf80) and the block tables kept by slot.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run116; mkdir -p $W
T0=$(date +%s)
timeout --signal=INT 400 python3 -m bench sweep --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 8300 \
  --out $W/sweep > $W/sweep.log 2>&1
echo "sweep: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "loading|Warn|warn" $W/sweep.log | tail -24
python3 -c "
import json; d=json.load(open('$W/sweep/sweep.json'))
print([(r['prompt_len'], r['batch'], r['missing_tokens'], round(r['ms_per_step'], 3)) for r in d['rows']])" 2>&1 | tail -2
tar czf $OUT/run116.tgz -C $W .
