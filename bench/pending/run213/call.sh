#!/bin/bash
# Any GPU (~5 min; run214 is its second call, on the same warm machine). Session 43's speculative prompt steps of
# several sequences (cff45d7; their GPU tests passed in run 217): what the drafts graphs cost at start-up. `bench
# startup` with speculative decoding (k = 2) on a 64-slot engine (4 sequence buckets x 14 token buckets, a prompt graph
# and a drafts graph each) against --max-prefill-capture-seqs 1 (14 keys): the children report capture_prefill_s and
# prefill_keys. Predicted ~0.1-0.2 s a key warm, so ~+5-10 s.
RUN=run213 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
COMMON=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 64 --max-model-len 9216
  --speculative-config '{"method": "mtp", "num_speculative_tokens": 2}')
TAIL=20 step startup_one_seq 290 python3 -m bench startup "${COMMON[@]}" --max-prefill-capture-seqs 1 --out $W/one_seq
# the second half, with the several-sequence keys, is run214's
