#!/bin/bash
# Whichever GPU comes. An H200: run163 (#20's c1 / c16 cookbook cells and the sweep at batch 1-16 on one 16-slot
# engine; c16 and b8-b16 last measured in run 142). An H100: run208's GDN decode at bf16 / float32 pools (which
# launch a bf16 pool wants), then #23's table past batch 1 (`bench spec` at batch 8, k = 2).
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "$GPU"
if [[ "$GPU" == *H200* ]]; then
    RUN=run209 source bench/device_env.sh || exit 1
    TAIL=30 step bench 560 python3 -m bench cookbook,sweep --model qwen3.5-0.8b --device cuda --dtype bfloat16 \
      --max-model-len 9216 --max-num-seqs 16 --no-mixed-steps -p cookbook.concurrency=1,16 \
      -p sweep.batches=1,2,4,8,16 --out $W/bench
    exit 0
fi
RUN=run209 source bench/device_env.sh || exit 1
SKIP=store_kv,paged_attention_decode,paged_attention_prefill,causal_conv1d_decode,causal_conv1d_prefill,gated_delta_rule_prefill,gated_deltanet_commit,gated_deltanet_verify,linear,sweep,FLA
OPS="python3 bench/ops_microbench.py --batches 16,32,64,128,256 --skip $SKIP --no-baseline"
TAIL=60 step bf16 150 $OPS --state-dtype bfloat16 --out $W/bf16
TAIL=60 step fp32 100 $OPS --out $W/fp32
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-model-len 512
  -p spec.ks=2 -p spec.rates=0.8,1.0 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=2)
TAIL=16 step spec_b8 290 "${SPEC[@]}" --max-num-seqs 8 -p spec.batches=8 --out $W/spec_b8
