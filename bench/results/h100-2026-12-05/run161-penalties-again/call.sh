#!/bin/bash
# run160's penalty steps again with longer limits (its first compiles of the penalised step ran past 100 and 120 s):
# `bench sampling` with the penalty kernel, then its reference, then the penalised engine's GPU tests.
RUN=run161 source bench/device_env.sh || exit 1
P=ops/penalties.py
KERNEL='    cuda=penalty_kernels.apply_penalties_ if HAVE_TRITON else None,'
grep -qxF "$KERNEL" $P || { echo "ops/penalties.py is not the registration this call expects"; exit 1; }
B=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096)
TAIL=6 step pen_kernel 240 python3 -m bench sampling "${B[@]}" -p sampling.repetition_penalty=1.1 --out $W/pen_kernel
sed -i "s/^$KERNEL\$/    cuda=None,/" $P && grep -cx '    cuda=None,' $P
TAIL=6 step pen_reference 100 python3 -m bench sampling "${B[@]}" -p sampling.repetition_penalty=1.1 --out $W/pen_reference
sed -i "s/^    cuda=None,\$/$KERNEL/" $P
TAIL=6 step penalties 200 python3 -m pytest -q -x -m gpu tests/test_penalties.py
