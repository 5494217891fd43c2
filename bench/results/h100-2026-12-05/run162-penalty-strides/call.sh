#!/bin/bash
# After the penalty kernel's fix (it read the sampler's rows, a column of the uploaded token table, as contiguous:
# run161's cudaErrorInvalidAddressSpace in `bench sampling` and the cuda-speculative test's divergence): the
# penalised engine's GPU tests and the kernel's, then `bench sampling` with the kernel and with its reference.
RUN=run162 source bench/device_env.sh || exit 1
P=ops/penalties.py
KERNEL='    cuda=penalty_kernels.apply_penalties_ if HAVE_TRITON else None,'
grep -qxF "$KERNEL" $P || { echo "ops/penalties.py is not the registration this call expects"; exit 1; }
TAIL=6 step penalties 200 python3 -m pytest -q -m gpu tests/test_penalties.py tests/test_kernels_cuda.py -k "penalties or penalised"
B=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096)
TAIL=3 step pen_kernel 150 python3 -m bench sampling "${B[@]}" -p sampling.repetition_penalty=1.1 --out $W/pen_kernel
sed -i "s/^$KERNEL\$/    cuda=None,/" $P && grep -cx '    cuda=None,' $P
TAIL=3 step pen_reference 90 python3 -m bench sampling "${B[@]}" -p sampling.repetition_penalty=1.1 --out $W/pen_reference
sed -i "s/^    cuda=None,\$/$KERNEL/" $P
