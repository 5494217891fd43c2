#!/bin/bash
# Session 20, call 4: bench sweep at batch 32-256, contexts 512 and 8,192 (256-slot engine), with the block tables
# kept by slot. The 8,192 cells past batch 16 were never measured; run 112 put the 512 x 8,192 step's GPU time at
# 91.6% of its bound with its host time (then 17.4 ms) in series: predicted >= 60% at 8,192 from batch 32 on.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run115; mkdir -p $W
T0=$(date +%s)
timeout --signal=INT 480 python3 -m bench sweep --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 8300 \
  -p sweep.batches=32,64,128,256 -p sweep.prompt_len=8192,512 --out $W/sweep > $W/sweep.log 2>&1
echo "sweep: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "loading|Warn|warn" $W/sweep.log | tail -14
tar czf $OUT/run115.tgz -C $W .
