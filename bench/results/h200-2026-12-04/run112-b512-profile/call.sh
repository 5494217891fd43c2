#!/bin/bash
# Session 20, call 1 (cold machine): where c1024's decode step goes. 1. ce::attention_decode at 512 x 8,192 and
# 1 x 8,192 (configs around the default); 2. bench step_profile's runtime rows at 512 rows, context 8,192 (the
# c1024 cell's decode step; its engine rows skipped: they would prefill 512 x 8,192 tokens a second time).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run112; mkdir -p $W
T0=$(date +%s)
timeout --signal=INT 110 python3 bench/attention_decode_sweep.py --out $W/attn --cases 512x8192,1x8192 > $W/attn.log 2>&1
echo "attention sweep: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn" $W/attn.log | head -30
tar czf $OUT/run112.tgz -C $W .
timeout --signal=INT $(( 570 - ($(date +%s) - T0) )) python3 -m bench step_profile --model qwen3.5-0.8b --device cuda --dtype bfloat16 \
  --max-num-seqs 512 --max-model-len 9216 -p step_profile.batches=512 -p step_profile.context=8192 -p step_profile.steps=5 \
  -p step_profile.prefill_seqs=1 -p step_profile.prefill_len=64 -p step_profile.engine=false --out $W/sp > $W/sp.log 2>&1
echo "step_profile: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "loading|Warn|warn" $W/sp.log | tail -40
tar czf $OUT/run112.tgz -C $W .
