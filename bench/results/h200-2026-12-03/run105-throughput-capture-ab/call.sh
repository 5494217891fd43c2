#!/bin/bash
# Session 18, call 4 (cold machine): run 104's throughput workload lost 3% and its prompt steps ran 35-50% slower than
# run 86's (68 -> 103 ms for the first), with 16 cudaMallocs in the timed run (run 86: 0). A/B on one machine:
# prompt capture off (--max-prefill-capture-tokens 0), then on (the default), each its own process; then
# bench/recurrent_prefill.py's TTFT with the captured steps on the chunked form (run 103's cut at its limit).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
B=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096)
timeout --signal=INT 200 python3 -m bench throughput "${B[@]}" --max-prefill-capture-tokens 0 --out $OUT/off > $OUT/off.log 2>&1
timeout --signal=INT 100 python3 -m bench throughput "${B[@]}" --out $OUT/on > $OUT/on.log 2>&1
timeout --signal=INT 100 python3 -m bench throughput "${B[@]}" --max-prefill-capture-tokens 0 --out $OUT/off2 > $OUT/off2.log 2>&1
for f in off on off2; do echo "== $f"; grep -E "^throughput" $OUT/$f.log; python3 -c "
import json,sys; d=json.load(open('$OUT/$f/throughput.json'))['ours']
print(' allocs', d['allocator'], 'prefill', d['steps']['prefill'], 'first', [s['s'] for s in d['steps']['first'][:9]])"; done
timeout --signal=INT 150 python3 bench/recurrent_prefill.py --out $OUT/rp --repeats 3 --tokens 16,128,512,1024,2048,4096,8192 > $OUT/rp.log 2>&1
grep -E "ttft" $OUT/rp.log | tail -16
