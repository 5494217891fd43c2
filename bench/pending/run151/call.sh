#!/bin/bash
# Session 28, after run 150 (bench sampling with repetition_penalty 1.1, one round, cold: 1,730 against greedy 23,791
# output tok/s; five prefill steps of 3.6-9.5 s: ce::sample's Triton kernels compiled again for each pointer
# alignment of sampling_batch's fields). With the fields aligned (upload_fields): the same workload, two rounds (the
# bench's default), then plain sampling. Predicted: penalties within ~10% of plain sampled.
RUN=run151 source bench/device_env.sh || exit 1
B=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096)
TAIL=4 step sampling_pen 260 python3 -m bench sampling "${B[@]}" -p sampling.repetition_penalty=1.1 --out $W/sampling_pen
TAIL=4 step sampling 150 python3 -m bench sampling "${B[@]}" --out $W/sampling
