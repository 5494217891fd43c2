#!/bin/bash
# Session 28 (the device tool's command, on run 149's warm machine; tree dad9055):
RUN=run150 source bench/device_env.sh && TAIL=30 step sampling_pen 480 python3 -m bench sampling --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096 -p sampling.repetition_penalty=1.1 -p sampling.rounds=1 --out $W/sampling_pen
