#!/bin/bash
# Session 18, call 2 (cold machine): captured prompt steps take the chunked delta rule at every length (`graphed`),
# buckets 16..1024 in powers of two then every 1,024 to 8,192, the memory plan leaving room for their pool.
# GPU tests; bench/recurrent_prefill.py TTFT; the cookbook's c1 and c16 cells on a 16-slot engine (run 79's shape):
# its 8,192-token prompts are now captured steps.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout --signal=INT 120 python3 -m pytest -q -p no:cacheprovider tests/test_prefill_graphs.py tests/test_kernels_cuda.py -k "graphed or skip_rows or captured or prefill_buckets" 2>&1 | tail -4
timeout --signal=INT 110 python3 bench/recurrent_prefill.py --out $OUT/rp --repeats 3 --tokens 16,128,512,1024,4096,8192 2>&1 | grep ttft
timeout --signal=INT 330 python3 -m bench cookbook --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-model-len 9216 --max-num-seqs 16 -p cookbook.concurrency=1,16 --verbose --out $OUT/cookbook > $OUT/cookbook.log 2>&1
grep -E "memory plan|captured|KV cache" $OUT/cookbook.log | head -5; tail -25 $OUT/cookbook.log
