#!/bin/bash
# The penalty kernel against its reference in whole runs (runs 160-162 on an H100 measured only the reference: the
# first `bench sampling` of a call spends over 120 s compiling the 256-row engine, and the kernel's run came first).
# Plain `bench sampling` first (it compiles the engine's graphs and ce::sample's kernels, and is the no-penalty
# baseline), then with repetition_penalty 1.1 on the kernel, on its reference (sed), on the kernel again. Predicted:
# the kernel's sampled/greedy above the reference's (runs 160-162: 0.77 / 0.67 / 0.73 with the reference; 0.94
# without penalties), by the ~6 GB of temporaries a step it saves at 256 rows.
RUN=run157 source bench/device_env.sh || exit 1
P=ops/penalties.py
KERNEL='    cuda=penalty_kernels.apply_penalties_ if HAVE_TRITON else None,'
grep -qxF "$KERNEL" $P || { echo "ops/penalties.py is not the registration this call expects"; exit 1; }
B=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096)
TAIL=3 step sampling 240 python3 -m bench sampling "${B[@]}" --out $W/sampling
TAIL=3 step pen_kernel 120 python3 -m bench sampling "${B[@]}" -p sampling.repetition_penalty=1.1 --out $W/pen_kernel
sed -i "s/^$KERNEL\$/    cuda=None,/" $P && grep -cx '    cuda=None,' $P
TAIL=3 step pen_reference 100 python3 -m bench sampling "${B[@]}" -p sampling.repetition_penalty=1.1 --out $W/pen_reference
sed -i "s/^    cuda=None,\$/$KERNEL/" $P
TAIL=3 step pen_kernel2 100 python3 -m bench sampling "${B[@]}" -p sampling.repetition_penalty=1.1 --out $W/pen_kernel2
export_caches
