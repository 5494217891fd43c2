#!/bin/bash
# Session 17, calls 2-3 (two cold machines; issued from the device tool directly). Call 2 (tree 4be8df3) ran the same
# sweep with a bench bug (the timed calls updated the pool the second form's checked call then started from, so the
# two forms' outputs were compared from different states) and failed the TTFT step (a prompt passed as a dict) and
# one test (the FLA-fields test ran the recurrent form at 456 tokens); fixed, call 3 (the tree after it) ran:
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1 COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
timeout --signal=INT 150 python3 -m pytest -q -p no:cacheprovider tests/test_kernels_cuda.py -k "gated_delta_rule_prefill or eager_prefill_step_has_no_host_sync"
timeout --signal=INT 300 python3 bench/recurrent_prefill.py --out $OUT/r/rp --repeats 5 --tokens 16,128,512,1024,2048,4096
