#!/bin/bash
# Session 23, call 9 (the last ~300 s): bench sweep at batch 128 and 256, context 512, after the GDN decode rule took the
# fused kernel in V tiles of 32 up to 256 sequences (run 116, the unfused kernels there: b128 56.9%, b256 64.9%).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run133; mkdir -p $W
T0=$(date +%s)
step() { local name=$1 limit=$2; shift 2; timeout --signal=INT $limit "$@" > $W/$name.log 2>&1; echo "$name: exit $? at +$(( $(date +%s) - T0 ))s"; grep -vE "Warn|warn|loading weights" $W/$name.log | tail -${TAIL:-40}; tar czf $OUT/run133.tgz -C $W .; }
TAIL=12 step sweep 255 python3 -m bench sweep --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 \
  --max-model-len 1100 -p sweep.batches=128,256 -p sweep.prompt_len=512 --out $W/sweep
