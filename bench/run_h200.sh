#!/usr/bin/env bash
# The H200 benchmark run (one GPU, about 8 minutes): latency, sweep, throughput (each beside HF transformers on the
# same requests) and startup, on the Qwen3.5-0.8B shape with random bf16 weights.
#
# The caller provides (see the lead's command prefix):
#   * PYTHONPATH with the repository root and the FLA wheels, e.g.
#       python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site
#   * OUT: the folder handed back. Everything lands there flat, at most 6 files:
#       results.json   every scenario's JSON, merged (python -m bench report)
#       summary.txt    the table printed at the end of this script
#       log.txt        the whole log (tail 300 KB)
#       latency.png sweep.png throughput.png   (only when matplotlib is importable)
# Knobs (environment): BENCH_BUDGET_S (default 450: seconds for everything, stages get timeouts from what is left),
# BENCH_SCENARIOS (default latency,sweep,throughput; add prefix if wanted), BENCH_HF_LIMIT (default 256: requests of
# the throughput workload through HF), BENCH_HF_BATCH (default 256), BENCH_HF_MAX_TIME (default 100 s for HF's
# throughput batches; a batch cut there is reported as truncated).
# HF's decode is host-bound (~0.1 s a step at batch 1 and nearly the same at batch 256), so its time is about
# 0.1 s x the longest output of a batch: one batch of all 256 requests is both HF's best throughput and ~100 s.
#
# BENCH_STARTUP_TIMEOUT (default 150: seconds for each start-up subprocess, cold and warm), BENCH_MAIN_RESERVE
# (default 260: seconds kept for the main run; startup gets at most what is left beyond it).
#
# Order: the model build; startup (a cold subprocess with empty compile caches, then a warm one on the same
# caches); then the main run (ours, then HF) on those warm caches, so the decode graphs are compiled cold only once
# in the whole script (a cold child cut short by its timeout still leaves every graph it finished in the cache).
# A stage that runs out of time loses only its own numbers: every scenario writes its JSON as soon as it is done,
# and the report always runs.
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the output folder}"
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/bench-h200.XXXXXX)
LOG="$WORK/log.txt"
BUDGET=${BENCH_BUDGET_S:-450}
SCENARIOS=${BENCH_SCENARIOS:-latency,sweep,throughput}
HF_LIMIT=${BENCH_HF_LIMIT:-256}
HF_BATCH=${BENCH_HF_BATCH:-256}
HF_MAX_TIME=${BENCH_HF_MAX_TIME:-100}
STARTUP_TIMEOUT=${BENCH_STARTUP_TIMEOUT:-150}
MAIN_RESERVE=${BENCH_MAIN_RESERVE:-260}
T0=$(date +%s)
export COMPILED_ENGINE_CACHE=${COMPILED_ENGINE_CACHE:-/tmp/compiled_engine_cache}
CACHE="$WORK/compile-cache"  # the startup scenario fills it (cold), then reuses it (warm); so does the main run
# BENCH_ARGS replaces the model/engine arguments and BENCH_EXTRA adds arguments to the main run (a dry run of this
# script on a CPU: BENCH_ARGS="--model tiny --device cpu --max-num-seqs 4 --max-model-len 64" BENCH_EXTRA="-p ...").
read -ra COMMON <<<"${BENCH_ARGS:---model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096}"
read -ra EXTRA <<<"${BENCH_EXTRA:-}"

left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
log() { echo "[run_h200 +$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
stage() {  # stage NAME TIMEOUT_S CMD...: CMD's output goes to the log; returns CMD's exit status
    local name=$1 limit=$2
    shift 2
    if (( limit < 30 )); then
        log "$name: skipped, ${limit}s of budget left"
        return 99
    fi
    log "$name (timeout ${limit}s): $*"
    timeout --signal=INT --kill-after=20 "$limit" "$@" >>"$LOG" 2>&1
    local rc=$?
    log "$name: exit $rc$( (( rc == 124 )) && echo ' (timed out)')"
    return $rc
}
has_results() {  # has_results DIR: at least one scenario JSON without an error
    python3 - "$1" <<'EOF'
import glob, json, sys
ok = any("error" not in json.load(open(f)) for f in glob.glob(sys.argv[1] + "/*.json"))
sys.exit(0 if ok else 1)
EOF
}

log "work folder $WORK, budget ${BUDGET}s, scenarios $SCENARIOS"
python3 - >>"$LOG" 2>&1 <<'EOF'
import importlib.util, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda)
for name in ("triton", "transformers", "fla", "matplotlib", "causal_conv1d"):
    spec = importlib.util.find_spec(name)
    version = None
    if spec is not None:
        try:
            version = __import__(name).__version__
        except Exception as e:
            version = f"import failed: {e}"
    print(f"{name}: {version if spec else 'not installed'}")
print("devices:", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
EOF
tail -n 8 "$LOG"

stage model 150 python3 -c "import sys; from bench.models import resolve_model; print(resolve_model(sys.argv[1]))" \
    "$(python3 -c "import sys; a = sys.argv[1:]; print(a[a.index('--model') + 1])" "${COMMON[@]}")"

# Startup: cold and warm subprocesses; they leave warm compile caches in $CACHE. The main run comes first in
# priority: startup gets what is left beyond MAIN_RESERVE (its JSON is written after the cold run already).
STARTUP_LIMIT=$(( $(left) - MAIN_RESERVE ))
(( STARTUP_LIMIT > 2 * STARTUP_TIMEOUT + 40 )) && STARTUP_LIMIT=$(( 2 * STARTUP_TIMEOUT + 40 ))
stage startup "$STARTUP_LIMIT" python3 -m bench startup "${COMMON[@]}" --out "$WORK/startup" \
    -p startup.cache_dir="$CACHE" -p startup.timeout_s="$STARTUP_TIMEOUT" \
    -p startup.total_timeout_s="$(( STARTUP_LIMIT - 30 ))"

# Main run on the warm caches, with everything that is left.
export TORCHINDUCTOR_CACHE_DIR="$CACHE/inductor" TRITON_CACHE_DIR="$CACHE/triton"
stage main $(( $(left) - 15 )) python3 -m bench "$SCENARIOS" "${COMMON[@]}" --vs-hf \
    --hf-limit "$HF_LIMIT" --hf-batch-size "$HF_BATCH" --hf-max-time "$HF_MAX_TIME" "${EXTRA[@]}" --out "$WORK/main"
if ! has_results "$WORK/main"; then  # the compiled engine failed before any number: get eager numbers instead
    log "main produced no result: retrying with --enforce-eager (smaller sizes)"
    stage main-eager $(( $(left) - 15 )) python3 -m bench "$SCENARIOS" "${COMMON[@]}" --enforce-eager --vs-hf \
        --hf-limit 64 --hf-batch-size 64 --hf-max-time 45 -p latency.repeats=1 -p latency.new_tokens=128 \
        -p sweep.steps=16 "${EXTRA[@]}" --out "$WORK/main-eager"
fi

log "report"
dirs=()
for d in "$WORK/startup" "$WORK/main" "$WORK/main-eager"; do [ -d "$d" ] && dirs+=("$d"); done
python3 -m bench report "${dirs[@]}" --out "$OUT" 2>>"$LOG" | tee -a "$LOG"
log "done in $(( $(date +%s) - T0 ))s"
tail -c 300000 "$LOG" >"$OUT/log.txt"
ls -la "$OUT"
