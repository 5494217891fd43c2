#!/bin/bash
# Any GPU: the GDN decode's V tiles over programs (SPLIT_V) at 16-256 sequences, never timed past 16 (run 134).
# At 256 the fused kernel in V tiles of 32 walked in order (175.6 µs, run 132) trails the delta rule alone (152.8),
# which streams one tile a program: the split gives the fused kernel that grid. Op rows; then bench/gdn_stream_probe.py:
# the delta rule in a persistent grid with Triton's pipelined loads, against the kernel of one tile a program.
RUN=run202 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
SKIP=store_kv,paged_attention_decode,paged_attention_prefill,causal_conv1d_decode,causal_conv1d_prefill,gated_delta_rule_prefill,gated_deltanet_commit,gated_deltanet_verify,linear,sweep,FLA
TAIL=60 step ops 170 python3 bench/ops_microbench.py --batches 16,32,64,128,256 --skip $SKIP --no-baseline --out $W/ops
TAIL=30 step probe 150 python3 bench/gdn_stream_probe.py --batches 64,128,256 --out $W/probe
