#!/bin/bash
# Session 28, after run 150. Prepared as two steps (penalties, then plain sampling); the first call's machine was
# taken back before it finished, and with 351 s of device time left the second ran the first step alone (cold
# machine, cut at its 220 s limit while ce::sample's kernels still compiled for the sampled run). Tree: 89f6955
# (sampling_batch's fields aligned; ce::sample's workspace views not yet).
RUN=run151 source bench/device_env.sh && TAIL=4 step sampling_pen 220 python3 -m bench sampling --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096 -p sampling.repetition_penalty=1.1 --out $W/sampling_pen
