#!/bin/bash
# What an eager prompt step of several sequences costs against the captured step of one (bench/prompt_steps.py):
# the case for capturing mixed steps and steps of several prompts. Any GPU.
RUN=run196 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=20 step prompt_steps 300 python3 bench/prompt_steps.py --model qwen3.5-0.8b --out $W/prompt_steps
