#!/bin/bash
# Session 19, call 5 (the last 375 s of device time): bench sweep at batch 1-4, context 549, with the vocabulary on
# tensor cores at 3-4 rows (run 110's sweep was cut while its cold 8-slot engine compiled).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
timeout --signal=INT 270 python3 -m bench sweep --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 4 --max-model-len 1024 -p sweep.batches=1,2,3,4 -p sweep.prompt_len=512 --out $OUT/sweep > $OUT/sweep.log 2>&1
echo "sweep: exit $?"; grep -vE "loading|Warn|warn" $OUT/sweep.log | tail -12
