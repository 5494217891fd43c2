#!/bin/bash
# Session 18, call 3 (cold machine): bench/recurrent_prefill.py TTFT again (run 103's failed at the LLM's
# construction: its log kept whole this time), then bench latency + throughput with LLM's defaults (main's engine
# shape: 256 slots, max_model_len 4,096: prompt steps captured up to 4,096 tokens at start-up).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
timeout --signal=INT 120 python3 bench/recurrent_prefill.py --out $OUT/rp --repeats 3 --tokens 16,128,512,1024,2048,4096,8192 > $OUT/rp.log 2>&1
grep -E "ttft|Error|error" $OUT/rp.log | tail -25
timeout --signal=INT 330 python3 -m bench latency,throughput -p latency.repeats=2 --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096 --verbose --out $OUT/main > $OUT/main.log 2>&1
grep -E "memory plan|captured|compiled decode" $OUT/main.log | head -6; grep -v "^INFO\|^DEBUG\|loading weights" $OUT/main.log | tail -40
