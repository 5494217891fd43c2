#!/usr/bin/env bash
# One H200 session: install the FLA wheels, run the GPU tests, then the benchmark (bench/run_h200.sh).
# Usage (device tool, carry .whl):  bash bench/gpu_session.sh
# Knobs: GPU_TESTS (pytest selection, default the compiled-decode and kernel tests), GPU_TEST_TIMEOUT (default 200 s),
# MICROBENCH=1 also runs bench/ops_microbench.py, BENCH_BUDGET_S (passed on to run_h200.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the output folder}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
timeout "${GPU_TEST_TIMEOUT:-200}" python3 -m pytest -q -x ${GPU_TESTS:-tests/test_compile_gpu.py tests/test_kernels_cuda.py} \
    -p no:cacheprovider --durations=8 >"$OUT/gpu_tests.log" 2>&1
echo "gpu tests: exit $?"; tail -n 15 "$OUT/gpu_tests.log"
if [ "${MICROBENCH:-0}" = 1 ]; then
    timeout 150 python3 bench/ops_microbench.py --out "$OUT" --skip gated_delta_rule_prefill 2>&1 | tail -n 20
fi
bash bench/run_h200.sh
