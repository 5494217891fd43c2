#!/bin/bash
# Session 17, call 4 (cold machine; issued from the device tool directly), tree 94eac85: the captured prompt steps'
# tests (CPU padding test and the GPU capture test), bench/recurrent_prefill.py (op and TTFT, now with the captured
# column), the eager prefill step's no-sync test.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
timeout --signal=INT 100 python3 -m pytest -q -p no:cacheprovider tests/test_prefill_graphs.py
timeout --signal=INT 130 python3 bench/recurrent_prefill.py --out $OUT/rp --repeats 5 --tokens 16,128,512,1024
timeout --signal=INT 45 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_cuda.py -k "eager_prefill_step_has_no_host_sync"
