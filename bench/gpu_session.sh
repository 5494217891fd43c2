#!/usr/bin/env bash
# One device call (carry .whl, timeout 600) that checks and measures the engine as it is now. On one H200 the stages
# run one after another; on nvidia-h200-x2 they run as two single-GPU lanes, then tensor parallelism on both GPUs.
#   lane 0 (GPU 0): the skinny-GEMM kernel tests (tests/test_kernels_cuda.py -k linear; if they fail, every later
#                   stage runs with CE_SKINNY_GEMM=0, i.e. cuBLAS, and the log says so), the prefill kernels' tests
#                   (-k prefill), bench step_profile (batch 1/8/64/256 and one prefill step: GPU ms by kernel
#                   category, host ms, kernels per step; it compiles the decode graphs cold), bench prefix (off/on);
#   lane 1 (GPU 1, or GPU 0 afterwards): the compiled-decode tests (tests/test_compile_gpu.py: CUDA graphs captured,
#                   compiled == eager), bench latency + throughput (TP=1), throughput with prefix caching on;
#   two GPUs only:  tests/test_tensor_parallel_gpu.py (TP=2 == TP=1 over NCCL, CUDA graphs), then bench latency +
#                   throughput at TP=2, beside lane 1's TP=1 numbers.
# HF's numbers come from bench/run_h200.sh (they do not change with our code). All stages share one Inductor/Triton
# cache, so an engine compiles cold once per shape. Each stage has its own timeout, cut to what is left of
# GPU_SESSION_S (default 560 s); a stage cut short loses only its own numbers.
# Results: $OUT/results.json + summary.txt (bench report of every stage), test logs, and $OUT/session.tgz (all logs
# and JSON; the device tool returns at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the output folder}"
T0=$(date +%s)
BUDGET=${GPU_SESSION_S:-560}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # see bench/run_tp2.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
export COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
WORK=$(mktemp -d /tmp/gpu-session.XXXXXX)
GPUS=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
python3 -c "from bench.models import resolve_model; resolve_model('qwen3.5-0.8b', 'cuda')" || exit 1  # build once

stage() {  # stage NAME MAX_S END_S CMD...: CMD under min(MAX_S, END_S - now), output to $WORK/NAME.log
    local name=$1 limit=$2 left=$(( $3 - ($(date +%s) - T0) ))
    shift 3
    (( limit > left )) && limit=$left
    if (( limit < 25 )); then echo "$name: skipped (${limit}s left)"; return 99; fi
    echo "$name (timeout ${limit}s) at +$(( $(date +%s) - T0 ))s"
    timeout --signal=INT --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc at +$(( $(date +%s) - T0 ))s"
    return $rc
}

BENCH=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096)
lane0() {  # arguments: the stage end time (seconds from the start)
    stage test_linear 80 "$1" python3 -m pytest -q -x tests/test_kernels_cuda.py -k linear -p no:cacheprovider \
        || touch "$WORK/skinny_gemm_failed"
    touch "$WORK/verdict"
    skinny_verdict
    stage test_prefill_kernels 45 "$1" python3 -m pytest -q tests/test_kernels_cuda.py -k prefill -p no:cacheprovider
    stage step_profile 130 "$1" python3 -m bench step_profile "${BENCH[@]}" -p batches=1,8,64,256 --out "$WORK/profile"
    stage prefix 110 "$1" python3 -m bench prefix "${BENCH[@]}" --out "$WORK/prefix"
}
lane1() {
    stage test_compile 150 "$1" python3 -m pytest -q -x tests/test_compile_gpu.py -p no:cacheprovider --durations=5
    while [ ! -f "$WORK/verdict" ]; do sleep 2; done
    skinny_verdict
    stage main 100 "$1" python3 -m bench latency,throughput -p latency.repeats=2 "${BENCH[@]}" --out "$WORK/main"
    stage throughput_prefix_on 60 "$1" python3 -m bench throughput "${BENCH[@]}" --enable-prefix-caching --out "$WORK/throughput_on"
}
skinny_verdict() {  # the skinny-GEMM kernel failed its tests: every later stage uses cuBLAS (CE_SKINNY_GEMM=0)
    if [ -f "$WORK/skinny_gemm_failed" ]; then echo "skinny GEMM tests failed: CE_SKINNY_GEMM=0"; export CE_SKINNY_GEMM=0; fi
}

if (( GPUS > 1 )); then
    LANES_END=$(( BUDGET - 250 ))  # then tensor parallelism on both GPUs
    CUDA_VISIBLE_DEVICES=0 lane0 "$LANES_END" &
    CUDA_VISIBLE_DEVICES=1 lane1 "$LANES_END" &
    wait
    skinny_verdict
    stage test_tp2 150 $(( BUDGET - 90 )) python3 -m pytest -q -s tests/test_tensor_parallel_gpu.py -p no:cacheprovider
    stage tp2 100 "$BUDGET" python3 -m bench latency,throughput -p latency.repeats=2 "${BENCH[@]}" \
        --tensor-parallel-size 2 --out "$WORK/tp2"
else
    lane0 $(( BUDGET * 55 / 100 ))
    lane1 "$BUDGET"
fi

dirs=(); for d in profile prefix main throughput_on tp2; do [ -d "$WORK/$d" ] && dirs+=("$WORK/$d"); done
python3 -m bench report "${dirs[@]}" --out "$OUT" >/dev/null 2>&1
cat "$OUT/summary.txt"
for f in "$WORK"/test_*.log; do [ -f "$f" ] && tail -n 12 "$f" && cp "$f" "$OUT/"; done
tar czf "$OUT/session.tgz" -C "$WORK" . && ls "$OUT"
echo "done at +$(( $(date +%s) - T0 ))s (CE_SKINNY_GEMM=${CE_SKINNY_GEMM:-1}, $GPUS GPU(s))"
