#!/bin/bash
# Prepared in session 28 (its device time spent), not run yet. Run from the repository root (carry .whl); when it has
# run, move this folder under bench/results/ with its results.
#  - ce::sample's GPU tests after its workspace views moved to 16-byte boundaries (7dfa8f5; the interpreter checks
#    passed on the CPU);
#  - bench sampling with repetition_penalty 1.1, one round on a cold cache (run 150: 1,730 tok/s, prompt steps of
#    3.6-9.5 s compiling ce::sample per pointer alignment): predicted one compile of the fp32 variant (~7 s) at most;
#  - the same with two rounds (the warm figure), then plain sampling (temperature 0.8, top_p 0.95, top_k 50).
#    Predicted: penalised within ~10% of plain sampled; plain sampled within 5% of greedy (run 107-era: 1.018).
#    (Session 29 put ce::apply_penalties_ in the tree after this was written: the penalised figures here include
#    it; run155 times it against the torch reference.)
RUN=run152 source bench/device_env.sh || exit 1
TAIL=6 step tests 150 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py tests/test_compile_gpu.py -k "sample_matches_reference_after_lm_head or sample_many_small_rows or sampled_replays"
B=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096)
TAIL=4 step sampling_pen_cold 200 python3 -m bench sampling "${B[@]}" -p sampling.repetition_penalty=1.1 -p sampling.rounds=1 --out $W/sampling_pen_cold
TAIL=4 step sampling_pen 150 python3 -m bench sampling "${B[@]}" -p sampling.repetition_penalty=1.1 --out $W/sampling_pen
TAIL=4 step sampling 120 python3 -m bench sampling "${B[@]}" --out $W/sampling
export_caches
