#!/bin/bash
# Session 18, call 1 (cold machine): the captured prompt steps past the recurrent form (the chunked delta rule with
# its chunk table padded by skip rows): the GPU tests (skip rows bit-identical, no sync; the chunked buckets' capture
# against the eager runtime; the short buckets' capture), then bench/recurrent_prefill.py TTFT up to 8,192 tokens
# (chunked / recurrent / captured columns; the captured buckets now reach 8,192).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
timeout --signal=INT 170 python3 -m pytest -q -p no:cacheprovider tests/test_prefill_graphs.py tests/test_kernels_cuda.py -k "skip_rows or fla_fields or captured or prefill_buckets or eager_prefill_step_has_no_host_sync" 2>&1 | tail -20
timeout --signal=INT 300 python3 bench/recurrent_prefill.py --out $OUT/rp --repeats 5 --tokens 16,128,512,1024,2048,4096,8192 2>&1 | tail -40
