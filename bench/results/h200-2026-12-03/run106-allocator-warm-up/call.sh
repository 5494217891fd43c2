#!/bin/bash
# Session 18, call 5 (cold machine, the session's last device time): the memory plan runs the largest prefill once
# more after allocating the KV cache (memory_plan.warm_allocator); run 105's timed throughput runs made 16-17
# cudaMalloc calls and their first prompt steps ran ~20 ms slower than the later ones. Predicted: 0 calls, the first
# prompt steps ~33-49 ms, output tok/s +1%.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
timeout --signal=INT 175 python3 -m bench throughput --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096 --out $OUT/warm > $OUT/warm.log 2>&1
grep -E "^throughput" $OUT/warm.log; python3 -c "
import json; d=json.load(open('$OUT/warm/throughput.json'))['ours']
print(' allocs', d['allocator'], 'prefill', d['steps']['prefill'], 'first', [s['s'] for s in d['steps']['first'][:9]])"
tail -3 $OUT/warm.log
