#!/usr/bin/env bash
# One nvidia-h200-x2 call used as two single-GPU lanes, so one machine start and one call's device time give two
# GPUs' worth of measurement (the lanes share nothing but the host's 32 cores and the built model):
#   lane A (GPU 0): bench/run_h200.sh (startup cold/warm, latency, sweep, throughput, each beside HF transformers).
#   lane B (GPU 1): eager vs compiled decode at batch 1/8/64/256 (graphs.measure), the prefix scenario (caching off
#                   and on), throughput with caching on and off, and batch-1/8 decode compiled with Inductor's
#                   coordinate-descent tuning (an A/B for the batch-1 GEMV plan in bench/NOTES.md).
# Usage (device tool, kind nvidia-h200-x2, carry .whl, timeout 600):  bash bench/run_x2_lanes.sh
# Everything comes back as $OUT/lanes.tgz plus the two summaries (the device tool returns at most 8 files).
# On a one-GPU machine (nvidia-h200) pick one lane per call: LANES=a or LANES=b (both on GPU 0).
# Knobs: LANES (default "a b"), LANE_A_S / LANE_B_S (seconds per lane from the start, default 540 / 520).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the output folder}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # see bench/run_tp2.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 CE_NO_SHRINK=1
export COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache
WORK=$(mktemp -d /tmp/lanes.XXXXXX)
T0=$(date +%s)
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
# Build the random 0.8B checkpoint once, before the lanes race to build it.
MODEL=$(python3 -c "from bench.models import resolve_model; print(resolve_model('qwen3.5-0.8b', 'cuda').path)" | tail -n 1) || exit 1
echo "model built at +$(( $(date +%s) - T0 ))s"

lane_b() {
    local dir=$WORK/b
    mkdir -p "$dir"
    export CUDA_VISIBLE_DEVICES=$GPU_B TORCHINDUCTOR_CACHE_DIR=$dir/inductor TRITON_CACHE_DIR=$dir/triton
    local model=$MODEL
    local deadline=$(( T0 + ${LANE_B_S:-520} ))
    run() {  # run NAME MAX_S CMD...
        local name=$1 limit=$2 left=$(( deadline - $(date +%s) ))
        shift 2
        (( limit > left )) && limit=$left
        if (( limit < 30 )); then echo "lane B $name: skipped (${limit}s left)"; return; fi
        echo "lane B $name (timeout ${limit}s) at +$(( $(date +%s) - T0 ))s"
        timeout --signal=INT --kill-after=15 "$limit" "$@" >"$dir/$name.log" 2>&1
        echo "lane B $name: exit $? at +$(( $(date +%s) - T0 ))s"
    }
    local bench=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096)
    run decode_measure 200 python3 -m graphs.measure --model "$model" --device cuda --dtype bfloat16 --no-prefill \
        --decode-batches 1,8,64,256 --context 1024 --repeats 20
    run prefix 170 python3 -m bench prefix "${bench[@]}" --out "$dir/prefix"
    run throughput_on 110 python3 -m bench throughput "${bench[@]}" --enable-prefix-caching --out "$dir/throughput_on"
    run throughput_off 100 python3 -m bench throughput "${bench[@]}" --out "$dir/throughput_off"
    TORCHINDUCTOR_COORDINATE_DESCENT_TUNING=1 run decode_measure_cdt 200 python3 -m graphs.measure --model "$model" \
        --device cuda --dtype bfloat16 --no-prefill --decode-batches 1,8 --context 1024 --repeats 20
}

LANES=${LANES:-a b}
GPU_B=$(( $(nvidia-smi -L | wc -l) > 1 ? 1 : 0 ))
[[ $LANES == *a* ]] && ( export CUDA_VISIBLE_DEVICES=0 OUT=$WORK/a BENCH_BUDGET_S=$(( ${LANE_A_S:-540} - ($(date +%s) - T0) ))
  timeout --signal=INT --kill-after=15 $(( BENCH_BUDGET_S + 10 )) bash bench/run_h200.sh >"$WORK/lane_a.log" 2>&1
  echo "lane A: exit $?" ) &
[[ $LANES == *b* ]] && lane_b >"$WORK/lane_b.log" 2>&1 &
wait
echo "both lanes done at +$(( $(date +%s) - T0 ))s"
cat "$WORK/lane_a.log" "$WORK/lane_b.log" 2>/dev/null | grep -v "^$"
grep -h '"what": "decode' "$WORK"/b/decode_measure*.log
[ -f "$WORK/a/summary.txt" ] && cp "$WORK/a/summary.txt" "$OUT/summary_a.txt" && cat "$OUT/summary_a.txt"
python3 -m bench report "$WORK"/b/prefix "$WORK"/b/throughput_on "$WORK"/b/throughput_off --out "$WORK/b/report" \
    >"$OUT/summary_b.txt" 2>&1; cat "$OUT/summary_b.txt"
rm -rf "$WORK"/*/inductor "$WORK"/*/triton
tar czf "$OUT/lanes.tgz" -C "$WORK" . && ls -la "$OUT"
