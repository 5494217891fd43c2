#!/bin/bash
# Any GPU (~3 min): the GDN decode with a bf16 state pool against float32, at 16-256 sequences, every launch form
# ops_microbench times (whole heads, V tiles of 32 / 64, in order or with the prefetch, tiles over programs). Run 207:
# with `state_dtype=torch.bfloat16` the throughput workload's decode steps reached 58% of their bound against
# float32's 69%: the kernels move half the bytes with the same tiles. This says which launch a bf16 pool wants (the
# rule, gated_deltanet_kernels.DECODE_LAUNCHES, is float32's), e.g. twice the V columns a program.
RUN=run208 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
SKIP=store_kv,paged_attention_decode,paged_attention_prefill,causal_conv1d_decode,causal_conv1d_prefill,gated_delta_rule_prefill,gated_deltanet_commit,gated_deltanet_verify,linear,sweep,FLA
OPS="python3 bench/ops_microbench.py --batches 16,32,64,128,256 --skip $SKIP --no-baseline"
TAIL=60 step bf16 170 $OPS --state-dtype bfloat16 --out $W/bf16
TAIL=60 step fp32 120 $OPS --out $W/fp32
