#!/bin/bash
# Any GPU. Speculative prompt steps of several sequences captured with their drafts (this session): the captured
# prompt steps' GPU tests (the new several-sequence drafting case among them), then #23's table at batch 8, k = 2
# (run 209 on an H100 before the change: baseline TTFT 7.1 ms, the speculative runs' 38-66 ms: their 8-sequence
# prompt step ran eagerly; forced 0.8 1.37x, the MTP head under the rule 0.86x output tok/s). Predicted: TTFT ~8-10
# ms, forced 0.8 ~1.6x, the rule's acceptance-0 cell ~0.98x.
RUN=run211 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=8 step tests 200 python3 -m pytest -q -m gpu tests/test_prefill_graphs.py -p no:cacheprovider
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-model-len 512
  -p spec.ks=2 -p spec.rates=0.8,1.0 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=2)
TAIL=4 step spec_b8 330 "${SPEC[@]}" --max-num-seqs 8 -p spec.batches=8 --out $W/spec_b8
