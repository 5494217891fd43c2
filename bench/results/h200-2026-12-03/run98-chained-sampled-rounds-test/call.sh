#!/bin/bash
# Session 16, call 4: chained rounds with sampled rows (a chained graph per bucket and variant) checked on the GPU.
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
export COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
timeout --signal=INT 200 python3 -m pytest -q -p no:cacheprovider tests/test_speculative.py -k test_cuda_graph_rounds_equal_eager_on_gpu 2>&1 | tail -15
