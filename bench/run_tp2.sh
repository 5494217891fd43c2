#!/usr/bin/env bash
# Tensor parallelism on two H200s (the nvidia-h200-x2 machine), in one command:
#   1. tests/test_tensor_parallel_gpu.py: TP=2 == TP=1 (teacher-forced bf16 logits, compiled decode, CUDA graphs
#      with the all-reduces inside) on the Qwen3.5-0.8B shape with random weights;
#   2. the bench latency and throughput scenarios at TP=2 and at TP=1, merged into one report.
# About 6 minutes alone on the machine. Run it on its own: concurrent cold Inductor compiles of the 0.8B graphs
# (another job on the other GPU) each take twice as long and starved it once (bench/results/h200-2026-11-29/run2).
# Usage (device tool, kind nvidia-h200-x2, carry .whl):  bash bench/run_tp2.sh   (TP2_BENCH=0: the tests only)
# NVLink multicast stays off (NCCL_NVLS_ENABLE=0): it can take a shared host's GPUs out of service.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the output folder}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
WORK=$(mktemp -d /tmp/tp2.XXXXXX)
export TORCHINDUCTOR_CACHE_DIR="$WORK/inductor" TRITON_CACHE_DIR="$WORK/triton"
# The tests, under a time limit that leaves evidence: at the limit every process still running (pytest = rank 0, and the
# spawned rank 1) gets SIGABRT, on which faulthandler prints its Python stacks into the log (twice before, the test
# was killed at its limit with nothing in the log saying where it was).
PYTHONFAULTHANDLER=1 python3 -m pytest -q -s tests/test_tensor_parallel_gpu.py -p no:cacheprovider \
    -o log_cli=true --log-cli-level=INFO >"$OUT/tp2_tests.log" 2>&1 &
pid=$!
for ((i = 0; i < ${TP2_TEST_S:-420}; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
if kill -0 "$pid" 2>/dev/null; then
    echo "tp2 tests: still running at ${TP2_TEST_S:-420}s; Python stacks of each process follow" >>"$OUT/tp2_tests.log"
    pkill -ABRT -f multiprocessing.spawn; kill -ABRT "$pid"; sleep 5
    pkill -KILL -f multiprocessing.spawn; kill -KILL "$pid" 2>/dev/null
fi
wait "$pid"
echo "tp2 tests: exit $?"; tail -n 8 "$OUT/tp2_tests.log"
[ "${TP2_BENCH:-1}" = 0 ] && exit 0
COMMON=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096)
for tp in 2 1; do  # TP=2 first
    timeout 150 python3 -m bench latency,throughput "${COMMON[@]}" --tensor-parallel-size "$tp" \
        -p latency.repeats=1 --out "$OUT/tp$tp" >>"$OUT/bench_log.txt" 2>&1  # into $OUT as it goes: a cut run keeps it
    echo "bench tp=$tp: exit $?"
done
python3 -m bench report "$OUT/tp1" "$OUT/tp2" --out "$OUT" | tee "$OUT/summary_tp.txt"
