#!/bin/bash
# Session 30's third call: run152 and run155 (prepared in session 29) in one, after the penalised engine's GPU tests
# (HF's float64 logits; the prompt-row fix and ce::apply_penalties_ on CUDA). `bench sampling` at 256 rows
# (chat-like: prompts of 256-2,048 tokens, 32-512 output tokens) with repetition_penalty 1.1 and
# ce::apply_penalties_ (two rounds: the first one's prompt steps show whether ce::sample still compiles per pointer
# alignment, the second is the warm figure), the same with the op's CUDA kernel swapped for its torch reference
# (sed), then plain sampling (temperature 0.8, top_p 0.95, top_k 50). Predicted: the kernel -1 to -1.5 ms a decode
# step against the reference; penalised within ~10% of plain sampled; plain sampled within 5% of greedy (run
# 107-era 1.018). Run from the repository root with nothing applied (carry .whl, .cecache).
RUN=run157 source bench/device_env.sh || exit 1
F=ops/penalties.py
KERNEL='    cuda=penalty_kernels.apply_penalties_ if HAVE_TRITON else None,'
grep -qxF "$KERNEL" $F || { echo "ops/penalties.py is not the registration this call expects"; exit 1; }
TAIL=6 step penalties 100 python3 -m pytest -q -m gpu tests/test_penalties.py
B=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096)
TAIL=6 step pen_kernel 200 python3 -m bench sampling "${B[@]}" -p sampling.repetition_penalty=1.1 --out $W/pen_kernel
sed -i "s/^$KERNEL\$/    cuda=None,/" $F && grep -cx '    cuda=None,' $F
TAIL=6 step pen_reference 130 python3 -m bench sampling "${B[@]}" -p sampling.repetition_penalty=1.1 --out $W/pen_reference
sed -i "s/^    cuda=None,\$/$KERNEL/" $F
TAIL=6 step sampling 120 python3 -m bench sampling "${B[@]}" --out $W/sampling
export_caches
