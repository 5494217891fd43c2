#!/usr/bin/env bash
# One H200 call (device tool, kind nvidia-h200, carry .whl, timeout 600) that checks and measures the engine as it is
# now, stage after stage (about 9 minutes), most needed first:
#   1. the CUDA kernel tests of what changed (KERNEL_TESTS: a pytest -k expression; their Triton compiles are slow:
#      the whole file does not fit a call);
#   2. bench/ops_microbench.py: the decode ops alone at batch 1-256 (~40 s);
#   3. bench latency + throughput + sweep with LLM's defaults (it compiles the 0.8B decode graphs cold, ~100-200 s;
#      every later engine finds them cached; throughput profiles its first step);
#   4. bench latency again in a fresh process (the spread between processes), with cudagraph
#      trees instead of the runner's own CUDA graphs (CE_CUDA_GRAPHS=trees), without the GEMV's L2 prefetch
#      (CE_L2_PREFETCH=0), and with CE_PDL=0 (programmatic dependent launch off: the A/B for ops/triton/pdl.py);
#      bench step_profile (runtime decode at batch 1/8/64/256, the engine's own overlapped decode steps at the same
#      batches, one 8,192-token prefill step: GPU ms by kernel category, host ms, kernels per step);
#   5. throughput with 16,384-token prefill steps, throughput with prefix caching on, latency + throughput with the
#      synchronous engine (--no-overlap-decode), the compile tests, bench snapshot_methods, bench prefix;
#   6. bench/gemv_chain.py (the step's matmul chain: the rule's configs with and without the L2 prefetch; coordinate descent over the one-row configs: gemv_config's data)
#      and bench/gemv_sweep.py (skinny GEMM configs timed back to back): tuning data, best run alone.
#   7. (last: a default session has no time left for them; pick them with STAGES) the serving envelope:
#      cookbook: bench cookbook, SGLang's published Qwen3.5-0.8B H200 cells (8,192 in / 1,024 out, closed loop at
#        each concurrency of COOKBOOK_CONCURRENCY, default 1,16,64,256,1024) on an engine of max(COOKBOOK_CONCURRENCY)
#        sequences of 9,216 tokens. Cold, that engine compiles its decode graphs first (29 buckets at 1,024: ~3-5
#        min), then the cells take ~3 min (c=1024 alone ~100 s, each cell after 64 warm-up requests): run it alone,
#        STAGES=cookbook GPU_SESSION_S=595 STAGE_LIMITS="cookbook=580", or split it over two calls,
#        COOKBOOK_CONCURRENCY=1,16,64,256 then COOKBOOK_CONCURRENCY=1024;
#      sweep_contexts: bench sweep at batch 1-256 and contexts 512 and 8,192 on the cookbook's engine shape (its
#        graphs cached after the cookbook stage, for the same COOKBOOK_CONCURRENCY);
#      sampling: the chat-like workload greedy vs sampled (temperature 0.8, top_p 0.95, top_k 50) on the main
#        stage's engine shape.
#   8. (last too) speculative decoding: sampling_mtp (the sampling stage with MTP drafts, k = 2), test_speculative
#      (its GPU tests), spec and spec_draft_vocab (bench spec at batch 1, k = 2: speed-ups at forced acceptance, the
#      verify against a decode step, a round's kernels by category; then drafts over the first 32,768 ids), e.g.
#      STAGES="sampling sampling_mtp test_speculative spec spec_draft_vocab".
#   9. (last too) serve: the OpenAI server at c = 64 (1,024 in / 512 out, 256 streaming requests) against the offline
#      engine on the same requests (~90 s warm, ~240 s cold: two engines compile); serve_thread: the same with the
#      engine loop in a thread of the server.
# HF's numbers come from bench/run_h200.sh (they do not change with our code); tensor parallelism from
# bench/run_tp2.sh on nvidia-h200-x2. Stages run one at a time on purpose: concurrent cold Inductor compiles each
# took twice as long and starved three stages of run 2 (bench/results/h200-2026-11-29/run2). Each stage has its own
# timeout, cut to what is left of GPU_SESSION_S (default 560 s); a stage cut short loses only its own numbers.
# EXTRA_PYTHONPATH: appended to PYTHONPATH; $PWD/bench/stack_dumps makes every Python process print its whole stack
# each CE_STACK_DUMP_S seconds (where a stage's start-up time goes).
# EXPORT_CACHE=1: the compile caches come back under $OUT/cache; copied into .cecache (git-ignored) and carried, a
# later call restores them.
# Results: $OUT/results.json + summary.txt (bench report of every stage), test logs, and $OUT/session.tgz (all logs
# and JSON; the device tool returns at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the output folder}"
BUDGET=${GPU_SESSION_S:-560}
# STAGES="test_kernels main ...": run only these stages (default: all, in order); STAGE_LIMITS="test_compile=300 ...":
# override a stage's own time limit (the budget still caps it).
declare -A LIMIT_S=()
for item in ${STAGE_LIMITS:-}; do LIMIT_S[${item%%=*}]=${item#*=}; done
# The wheels, PYTHONPATH, the compile caches carried from an earlier call (EXPORT_CACHE=1 below; carry .cecache):
# Triton's kernels and autotune picks and Inductor's graphs, so a fresh machine skips most of the cold build (~100 s).
source bench/device_env.sh || exit 1
WORK=$(mktemp -d /tmp/gpu-session.XXXXXX)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "from bench.models import resolve_model; resolve_model('qwen3.5-0.8b', 'cuda')" || exit 1  # build once

stage() {  # stage NAME MAX_S CMD...: CMD under min(MAX_S, what is left of the budget), output to $WORK/NAME.log
    local name=$1 limit=${LIMIT_S[$1]:-$2} left=$(( BUDGET - ($(date +%s) - T0) - 10 ))
    shift 2
    if [ -n "${STAGES:-}" ] && [[ " $STAGES " != *" $name "* ]]; then return 0; fi
    (( limit > left )) && limit=$left
    if (( limit < 25 )); then echo "$name: skipped (${limit}s left)"; return 99; fi
    echo "$name (timeout ${limit}s) at +$(( $(date +%s) - T0 ))s"
    timeout --signal=INT --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
    local rc=$?
    echo "$name: exit $rc at +$(( $(date +%s) - T0 ))s"
    return $rc
}

BENCH=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096)
stage test_kernels 90 python3 -m pytest -v tests/test_kernels_cuda.py -k "${KERNEL_TESTS:-rms_norm or silu_mul}" -p no:cacheprovider
stage ops_microbench 90 python3 bench/ops_microbench.py --out "$WORK/ops_microbench" --batches 1,8,64,256 --no-baseline \
    --skip linear,paged_attention_prefill,causal_conv1d_prefill,gated_delta_rule_prefill
[ -f "$WORK/ops_microbench/ops_microbench.json" ] && cp "$WORK/ops_microbench/ops_microbench.json" "$OUT/"
stage main 260 python3 -m bench latency,throughput,sweep -p latency.repeats=2 -p sweep.prompt_len=512 "${BENCH[@]}" \
    --out "$WORK/main"
stage latency_again 90 python3 -m bench latency -p latency.repeats=2 "${BENCH[@]}" --out "$WORK/latency_again"
stage latency_trees 120 env CE_CUDA_GRAPHS=trees python3 -m bench latency -p latency.repeats=2 "${BENCH[@]}" \
    --out "$WORK/latency_trees"
stage latency_prefetch_off 90 env CE_L2_PREFETCH=0 python3 -m bench latency -p latency.repeats=2 "${BENCH[@]}" \
    --out "$WORK/latency_prefetch_off"
stage latency_pdl_off 60 env CE_PDL=0 python3 -m bench latency -p latency.repeats=2 "${BENCH[@]}" --out "$WORK/latency_pdl_off"
stage step_profile 90 python3 -m bench step_profile "${BENCH[@]}" -p batches=1,8,64,256 --out "$WORK/profile"
stage step_profile_pdl_off 120 env CE_PDL=0 python3 -m bench step_profile "${BENCH[@]}" -p batches=1,8 -p top=40 \
    --out "$WORK/profile_pdl_off"
stage throughput_16k 60 python3 -m bench throughput "${BENCH[@]}" --max-num-batched-tokens 16384 --out "$WORK/throughput_16k"
stage throughput_prefix_on 60 python3 -m bench throughput "${BENCH[@]}" --enable-prefix-caching --out "$WORK/throughput_on"
stage main_sync 60 python3 -m bench latency,throughput -p latency.repeats=2 "${BENCH[@]}" --no-overlap-decode --out "$WORK/main_sync"
stage test_compile 100 python3 -m pytest -q -x tests/test_compile_gpu.py -p no:cacheprovider --durations=5
stage snapshot_methods 45 python3 -m bench snapshot_methods --out "$WORK/snapshot"
stage prefix 110 python3 -m bench prefix "${BENCH[@]}" --out "$WORK/prefix"
stage gemv_chain_rule 60 python3 bench/gemv_chain.py --passes 0 --out "$WORK/gemv_chain_rule"
stage gemv_chain_rule_prefetch_off 60 env CE_L2_PREFETCH=0 python3 bench/gemv_chain.py --passes 0 \
    --out "$WORK/gemv_chain_rule_prefetch_off"
stage gemv_chain 150 python3 bench/gemv_chain.py --out "$WORK/gemv_chain"
[ -f "$WORK/gemv_chain/gemv_chain.json" ] && cp "$WORK/gemv_chain/gemv_chain.json" "$OUT/"
stage gemv_sweep 200 python3 bench/gemv_sweep.py --out "$WORK/gemv_sweep"
[ -f "$WORK/gemv_sweep/gemv_sweep.json" ] && cp "$WORK/gemv_sweep/gemv_sweep.json" "$OUT/"
# The serving envelope (7.): one engine shape for the cookbook and the sweep at 8,192 (a sequence of 8,192 + 1,024).
COOKBOOK_CONCURRENCY=${COOKBOOK_CONCURRENCY:-1,16,64,256,1024}
COOKBOOK=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-model-len 9216
          --max-num-seqs "$(tr , '\n' <<<"$COOKBOOK_CONCURRENCY" | sort -n | tail -1)")
# COOKBOOK_ARGS: more bench options for the cookbook stage alone (later ones win), e.g. "--max-num-seqs 512" or
# "--no-mixed-steps" (the scheduler's policies: compiled_engine/scheduler.py).
# shellcheck disable=SC2086
stage cookbook 540 python3 -m bench cookbook "${COOKBOOK[@]}" ${COOKBOOK_ARGS:-} \
    -p cookbook.concurrency="$COOKBOOK_CONCURRENCY" --out "$WORK/cookbook"
stage sweep_contexts 150 python3 -m bench sweep "${COOKBOOK[@]}" -p sweep.prompt_len=512,8192 --out "$WORK/sweep_contexts"
stage sampling 90 python3 -m bench sampling "${BENCH[@]}" --out "$WORK/sampling"
# Speculative decoding (8.): the sampling workload with MTP drafts, the GPU tests of speculative decoding (cold: their
# compiles take ~150-180 s), and the spec scenario at batch 1 and 8, k = 2, forced acceptance 0 and 0.8 (on the
# confident checkpoint the forced drafter needs: bench/spec.py), with the whole vocabulary drafting and with its
# first 32,768 ids (~250 s cold at 8 slots: run 94).
MTP='{"method": "mtp", "num_speculative_tokens": 2}'
SPEC=(--model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 8 --max-model-len 512
      -p spec.batches=1,8 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10)
stage sampling_mtp 150 python3 -m bench sampling "${BENCH[@]}" --speculative-config "$MTP" --out "$WORK/sampling_mtp"
stage test_speculative 240 python3 -m pytest -q -m gpu tests/test_speculative.py -p no:cacheprovider --durations=5
stage spec 330 python3 -m bench spec "${SPEC[@]}" --out "$WORK/spec"
stage spec_draft_vocab 300 python3 -m bench spec "${SPEC[@]}" -p spec.draft_vocab_size=32768 --out "$WORK/spec_vocab"
SERVE=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 -p concurrency=64 -p input_len=1024 -p output_len=512
       -p num_requests=256)
stage serve 240 python3 -m bench serve "${SERVE[@]}" --out "$WORK/serve"
stage serve_thread 240 python3 -m bench serve "${SERVE[@]}" -p engine_process=false --out "$WORK/serve_thread"
dirs=(); for d in profile profile_pdl_off main latency_again latency_prefetch_off latency_trees latency_pdl_off throughput_16k throughput_on main_sync snapshot prefix cookbook sweep_contexts sampling sampling_mtp spec spec_vocab serve serve_thread; do [ -d "$WORK/$d" ] && dirs+=("$WORK/$d"); done
python3 -m bench report "${dirs[@]}" --out "$OUT" >/dev/null 2>&1
cat "$OUT/summary.txt"
for f in "$WORK"/test_*.log; do [ -f "$f" ] && tail -n 12 "$f" && cp "$f" "$OUT/"; done
tar czf "$OUT/session.tgz" -C "$WORK" . && ls "$OUT"
if [ "${EXPORT_CACHE:-0}" = 1 ]; then
    rm -f "$OUT"/*.png  # room for them among the 8: the plots are in session.tgz too
    export_caches
    if (( $(ls "$OUT/cache" | wc -l) > 3 )); then echo "compile caches too large to export"; rm -r "$OUT/cache"; fi
    ls -la "$OUT/cache" 2>/dev/null
fi
echo "done at +$(( $(date +%s) - T0 ))s"
