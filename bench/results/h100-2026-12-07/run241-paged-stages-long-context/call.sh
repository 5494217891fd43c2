#!/bin/bash
# Any GPU (~8 min): the untimed lead of run 239. A batch-1 verify (k = 2) runs its 3 rows through the paged decode
# kernel at Triton's default stages; at a short table (2 splits, up to 8 key tiles a program) the stages paid there
# (1 stage lost ~9 µs a verify step). At a long context the rule gives 64 splits and each program walks 1-2 tiles,
# where ce::attention_decode gained 2-3 µs a call from 1 stage. `bench spec` batch 1, k = 2, forced 0.8 at an
# 8,192-token prompt, Triton's default then 1 stage up to 4 rows (paged_stages1.patch). Predicted: the verify graph
# -6 to -15 µs (6 layers x 1-2.5 µs), the round the same; level or worse would close the lead.
RUN=${RUN_NAME:-run241} source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1
  --max-model-len 9216 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0.8 -p spec.step_iters=10
  -p spec.prompt_len=8192 -p spec.draft_vocab_size=32768 -p spec.repeats=1)
TAIL=24 step spec_default 280 "${SPEC[@]}" --out $W/spec_default
git apply bench/pending/run241/paged_stages1.patch && echo "paged_stages1.patch applied"
TAIL=24 step spec_stages1 200 "${SPEC[@]}" --out $W/spec_stages1
