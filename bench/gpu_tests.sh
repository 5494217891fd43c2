#!/usr/bin/env bash
# The GPU tests, timed from cold compile caches, in one device call (kind nvidia-h200, carry .whl, timeout 600):
#   1. pytest -m "gpu and quick": one small reference check of every CUDA kernel (budget 90 s);
#   2. pytest -m gpu: every GPU test (budget 240 s; 209 s in run 50), on GPU_TEST_WORKERS pytest-xdist workers
#      (default 4; the device image lacks pytest-xdist: its wheel and execnet's come from .whl) sharing the
#      one GPU: the suite's time is compiling (Inductor, Triton), which is CPU work; --dist loadgroup keeps a module
#      that shares one compiled fixture on one worker (its xdist_group mark).
# Each run gets its own empty Triton and Inductor cache folders, so the second compiles and autotunes everything again,
# as a fresh machine would. TRITON_PRINT_AUTOTUNING=1 prints every autotune sweep with its time ("finished after"),
# in the log below the test that ran it. CE_NO_SHRINK=1: a failing hypothesis example is reported as drawn (shrinking
# it recompiles kernel variants for minutes). tests/test_server.py (CPU only) is left out: the device image has no openai.
# Results: $OUT/quick.log and $OUT/full.log (pytest -v -s --durations=30); the counts and slowest tests on stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the output folder}"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TRITON_PRINT_AUTOTUNING=1 CE_NO_SHRINK=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader

run() {  # run NAME LIMIT_S MARKER_EXPRESSION [PYTEST_ARGS...]
    local name=$1 limit=$2 markers=$3 work t0 rc
    shift 3
    work=$(mktemp -d /tmp/gpu-tests.XXXXXX)
    t0=$(date +%s)
    TRITON_CACHE_DIR="$work/triton" TORCHINDUCTOR_CACHE_DIR="$work/inductor" \
        timeout --signal=INT --kill-after=10 "$limit" \
        python3 -m pytest -m "$markers" -v -s -p no:cacheprovider --durations=30 \
            --ignore=tests/test_server.py "$@" tests >"$OUT/$name.log" 2>&1
    rc=$?
    echo "$name: exit $rc after $(( $(date +%s) - t0 )) s"
    grep -E "^[0-9.]+s (setup|call|teardown) |^=+ .*(passed|failed|error|skipped).* =+$" "$OUT/$name.log"
    echo "autotune sweeps: $(grep -c 'finished after' "$OUT/$name.log")"
}

# SUITES="full": only the second.
[[ " ${SUITES:-quick full} " == *" quick "* ]] && run quick 180 "gpu and quick"
[[ " ${SUITES:-quick full} " == *" full "* ]] && run full 400 "gpu" -n "${GPU_TEST_WORKERS:-4}" --dist loadgroup
