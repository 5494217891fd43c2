#!/bin/bash
# Any GPU. (1) `bench spec` at batch 1, k = 2 and 3, forced 0.8 (run181's question, with k = 2 beside it on the same
# machine): a third draft adds ~130 µs to a ~1,170-µs round (H100) for ~0.5 tokens more: predicted ~1.8x at k = 3
# against k = 2's ~1.65x by TPOT. (2) The 97-matmul chain at 3, 2 and 4 rows, one descent pass over down's and
# out_proj's tiles with the 4,096-wide candidates: down's whole K (3,584) in the chunk loaded before the PDL wait,
# instead of a second chunk after it. Run 166 charged down 6.0 µs a call at 3 rows for ~2.5 µs of bytes (128 programs,
# the second chunk's loads after the wait). Predicted: down ~3.5-4.5 µs a call, -40 to -60 µs a 3-row chain step; a
# loss would say the wait's tail, not the second chunk, is down's cost.
RUN=run182 source bench/device_env.sh || exit 1
TAIL=14 step spec_k23 260 python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 \
  --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2,3 -p spec.rates=0.8 -p spec.step_iters=10 \
  -p spec.draft_vocab_size=32768 -p spec.repeats=3 --out $W/spec_k23
TAIL=40 step chain 240 python3 bench/gemv_chain.py --out $W/chain --rows 3,2,4 --passes 1 --roles mlp_down,out_proj
