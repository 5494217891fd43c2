#!/bin/bash
# Prepared in session 29 (no device lent), not run yet; after run152 (whose penalised figures already include this
# op). Run from the repository root with nothing applied; when it has run, move this folder under bench/results/.
#  - ce::apply_penalties_ (session 29): the penalised rows' tokens as dense int32 codes by two scatters, then one
#    in-place Triton pass, against the torch reference on CUDA (the op's CUDA kernel swapped for its reference by
#    sed), A/B/A in `bench sampling` with repetition_penalty 1.1 at 256 rows (two rounds: the warm one is the
#    headline). By bytes: the reference makes and reads ~15 [P, V] temporaries (~110 bytes an element), the
#    kernel ~16: at 256 penalised rows of 248,320 logits ~6 GB less a step, predicted -1 to -1.5 ms a decode step
#    (greedy's ~3.7 ms; run 150's penalised decode steps 5.7 ms of wall each).
#  - its GPU test first (bit-equal to the reference on Qwen3.5's vocabulary at 1 and 64 rows).
RUN=run155 source bench/device_env.sh || exit 1
F=ops/penalties.py
KERNEL='    cuda=penalty_kernels.apply_penalties_ if HAVE_TRITON else None,'
grep -qxF "$KERNEL" $F || { echo "ops/penalties.py is not the registration this call expects"; exit 1; }
TAIL=4 step tests 90 python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k apply_penalties
B=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 4096 -p sampling.repetition_penalty=1.1)
TAIL=4 step pen_kernel 150 python3 -m bench sampling "${B[@]}" --out $W/pen_kernel
sed -i "s/^$KERNEL\$/    cuda=None,/" $F && grep -cx '    cuda=None,' $F
TAIL=4 step pen_reference 150 python3 -m bench sampling "${B[@]}" --out $W/pen_reference
sed -i "s/^    cuda=None,\$/$KERNEL/" $F
TAIL=4 step pen_kernel2 150 python3 -m bench sampling "${B[@]}" --out $W/pen_kernel2
export_caches
