#!/bin/bash
# `bench spec` at batch 1, k = 3, forced 0.8 (the session's last ~300 device-seconds): does a third draft reach what
# k = 2 does not? Run 180 (H100, k = 2): TPOT 0.4853 ms at 2.42 tokens a round, 1.653x over decode. Predicted from
# its round (~1,170 µs): one more verify row (~+40 µs) and one more MTP decode step with its draft lm_head (~+90 µs),
# ~1,300 µs a round at 1 + 0.8 + 0.64 + 0.51 = 2.95 tokens: TPOT ~0.44 ms, ~1.8x.
RUN=run181 source bench/device_env.sh || exit 1
TAIL=12 step spec_k3 230 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 \
  --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=3 -p spec.rates=0.8 -p spec.step_iters=10 \
  -p spec.draft_vocab_size=32768 -p spec.repeats=3 --out $W/spec_k3
