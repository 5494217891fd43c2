#!/bin/bash
# Session 20, call 3 (run 113's machine, warm): the nano-vllm throughput workload (256-slot engine) with the block
# tables kept by slot. Predicted: a few % over run 108's 33,326 output tok/s (its decode steps pack 256 tables of ~40-70 blocks).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
W=/tmp/run114; mkdir -p $W
T0=$(date +%s)
timeout --signal=INT 330 python3 -m bench throughput --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096 --out $W/tp > $W/tp.log 2>&1
echo "throughput: exit $? at +$(( $(date +%s) - T0 ))s"; grep -E "^throughput|tok/s" $W/tp.log | tail -4
tar czf $OUT/run114.tgz -C $W .
