#!/bin/bash
# Any GPU. On an H200: #20's cells on the tree as it stands (run231's command: the cookbook c1 / c16 and the sweep at
# batch 1-16 on one 16-slot engine, prefill first), first on this tree since run 194 (c1 TPOT 0.73 ms then; the decode
# reduce kernel's split since, -13 µs a step on an H100, run 233). On an H100: the whole cold start-up with FLA's
# recorded configs (run 236's cut step), against run 234's 151.9 s cold / 28.8 s warm. Predicted: cold ~119 s (the
# memory plan's 78.4 s less the ~33 s of FLA autotuning run 236 removed), warm level.
RUN=run237 source bench/device_env.sh || exit 1
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$GPU"
case "$GPU" in
  *H200*)
    TAIL=30 step bench 570 python3 -m bench cookbook,sweep --model qwen3.5-0.8b --device cuda --dtype bfloat16 \
      --max-model-len 9216 --max-num-seqs 16 --no-mixed-steps -p cookbook.concurrency=1,16 \
      -p sweep.batches=1,2,4,8,16 --out $W/bench ;;
  *)
    TAIL=12 step startup 560 python3 -m bench startup --model qwen3.5-0.8b --device cuda --dtype bfloat16 \
      --max-num-seqs 64 --max-model-len 9216 -p startup.total_timeout_s=540 --out $W/startup ;;
esac
