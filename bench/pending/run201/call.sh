#!/bin/bash
# Any GPU: what the captured steps of several sequences cost at start-up. `bench startup` (a cold and a warm child
# process each) on a 256-slot engine at max_model_len 9,216: 14 token buckets x 9 sequence buckets (two-fold since
# f37c2e4; ~120 keys) by default against 14 keys with --max-prefill-capture-seqs 1; the children report
# capture_prefill_s and prefill_keys apart from load_s and compile_capture_s. Predicted: ~0.05 s a key warm (run 218,
# H100: 50 keys in 4.0 s), so ~+5 s; the cold runs add new kernel variants (more sequences: the attention's SEQS_P,
# the conv's search bits).
RUN=run201 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
COMMON="--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 256 --max-model-len 9216"
TAIL=20 step startup_one_seq 290 python3 -m bench startup $COMMON --max-prefill-capture-seqs 1 --out $W/one_seq
TAIL=20 step startup_several 290 python3 -m bench startup $COMMON --out $W/several
