#!/bin/bash
# Any GPU (#20's cell is the H200's): nano-vllm's throughput workload with the recurrent state pool in float32 (the
# default, as vLLM's and SGLang's for Qwen3.5) and in bfloat16 (`--state-dtype`, the knob vLLM calls
# --mamba-ssm-cache-dtype). Predicted for bf16: the decode steps' bytes -30% (the state is ~60% of them at 256
# sequences), so +20-35% output tok/s; float32 again last, for the machine's drift.
RUN=run207 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TP="python3 -m bench throughput --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096"
TAIL=4 step tp_fp32 200 $TP --out $W/tp_fp32
TAIL=4 step tp_bf16 120 $TP --state-dtype bfloat16 --out $W/tp_bf16
TAIL=4 step tp_fp32_again 100 $TP --out $W/tp_fp32_again
