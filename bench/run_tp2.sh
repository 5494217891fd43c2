#!/usr/bin/env bash
# Tensor parallelism on two H200s (the nvidia-h200-x2 machine): issue 26. One stage per device call, each well under
# the 10-minute limit of a call (a stage is cut at STAGE_S, default 560 s, and keeps what it wrote under $OUT):
#   bash bench/run_tp2.sh tests          # tests/test_tensor_parallel_gpu.py, the 0.8B shape: TP=2 == TP=1 (bf16
#                                        #   logits, compiled decode with the all-reduces in the graphs) and a TP engine
#                                        #   never closed exits; ~5 min
#   bash bench/run_tp2.sh tests-80b      # the same file: TP=2 == TP=1 on the Qwen3-Next-80B-A3B shape cut to 8 layers
#                                        #   (fp32, random weights made on each GPU), and a worker SIGKILLed mid-step
#                                        #   raises WorkerError within 30 s on NCCL, then a new LLM starts; ~4 min
#   bash bench/run_tp2.sh allreduce      # the collectives of one decode step alone (2 all-reduces a layer + 1 of
#                                        #   [batch, hidden] bf16 + the logits all-gather, in CUDA graphs), batches
#                                        #   1/64/256, shapes 0.8B, 27B and 80B-A3B; ~1 min
#   bash bench/run_tp2.sh bench MODEL TP # batch-1 decode (latency), batch 1/64/256 decode at context 512 (sweep) and
#                                        #   the throughput workload, each against its bound (rank 0's shard: weight
#                                        #   bytes per rank), at tensor_parallel_size TP (1 or 2)
#       MODEL qwen3.5-0.8b: ~3 min a TP; qwen3.5-27b (27B-like dense, random weights drawn on the GPUs): ~6-8 min a
#       TP (64 layers compile cold: unmeasured); qwen3-next-80b-a3b: TP=2 only (159 GB in bf16), latency and
#       throughput (SCENARIOS=latency,throughput is its default; its 48-layer MoE compile is unmeasured)
# SCENARIOS overrides a bench stage's scenarios, STAGE_S its time limit. Compile caches live in /tmp/ce_* so that later
# calls on a machine that stayed warm reuse them. Merge the bench folders afterwards, on any machine:
#   python -m bench report OUT_TP1 OUT_TP2 --out MERGED
# Usage (device tool, kind nvidia-h200-x2, carry .whl). NVLink multicast stays off (NCCL_NVLS_ENABLE=0): it can take a
# shared host's GPUs out of service.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the output folder}"
STAGE=${1:?usage: bash bench/run_tp2.sh tests|tests-80b|allreduce|bench MODEL TP}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
export COMPILED_ENGINE_CACHE=/tmp/compiled_engine_cache TORCHINDUCTOR_CACHE_DIR=/tmp/ce_inductor TRITON_CACHE_DIR=/tmp/ce_triton
nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv,noheader
LIMIT=${STAGE_S:-560}

# The tests, under a time limit that leaves evidence: at the limit every process still running (pytest = rank 0, and
# the spawned rank 1) gets SIGABRT, on which faulthandler prints its Python stacks into the log (twice before, the test
# was killed at its limit with nothing in the log saying where it was).
run_tests() {
    local log="$OUT/tp2_tests_$1.log"
    PYTHONFAULTHANDLER=1 python3 -m pytest -q -s tests/test_tensor_parallel_gpu.py -p no:cacheprovider -k "$2" \
        -o log_cli=true --log-cli-level=INFO >"$log" 2>&1 &
    local pid=$!
    for ((i = 0; i < LIMIT; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then
        echo "tp2 tests: still running at ${LIMIT}s; Python stacks of each process follow" >>"$log"
        pkill -ABRT -f multiprocessing.spawn; kill -ABRT "$pid"; sleep 5
        pkill -KILL -f multiprocessing.spawn; kill -KILL "$pid" 2>/dev/null
    fi
    wait "$pid"
    echo "tp2 tests ($1): exit $?"; tail -n 12 "$log"
}

case "$STAGE" in
tests) run_tests 0.8b "equals_tp1_on_two_gpus or never_closed" ;;
tests-80b) run_tests 80b "qwen3_next_80b or killed_mid_step" ;;
allreduce)
    for model in qwen3.5-0.8b qwen3.5-27b qwen3-next-80b-a3b; do
        timeout 150 python3 -m bench.allreduce_microbench --model "$model" --batches 1,64,256 --out "$OUT" \
            >>"$OUT/allreduce_log.txt" 2>&1
        echo "allreduce $model: exit $?"
    done
    tail -n 12 "$OUT/allreduce_log.txt"
    ;;
bench)
    MODEL=${2:?bench MODEL TP}
    TP=${3:?bench MODEL TP}
    default=latency,sweep,throughput
    [ "$MODEL" = qwen3-next-80b-a3b ] && default=latency,throughput
    timeout "$LIMIT" python3 -m bench "${SCENARIOS:-$default}" --model "$MODEL" --device cuda --dtype bfloat16 \
        --tensor-parallel-size "$TP" --max-num-seqs 256 --max-model-len 4096 -p latency.repeats=1 \
        -p sweep.batches=1,64,256 -p sweep.prompt_len=512 -p sweep.steps=32 \
        --out "$OUT/$MODEL-tp$TP" >"$OUT/bench_log.txt" 2>&1  # into $OUT as it goes: a cut run keeps it
    echo "bench $MODEL tp=$TP: exit $?"
    tail -n 25 "$OUT/bench_log.txt"
    ;;
*) echo "unknown stage $STAGE"; exit 2 ;;
esac
# A command cut by `timeout` leaves its spawned ranks behind (rank 1 holding GPU 1, waiting in a collective): the
# next call on a machine that stayed warm would find that GPU taken.
pkill -KILL -f multiprocessing.spawn 2>/dev/null || true
