#!/bin/bash
# Any GPU (~8 min cold). Sequence buckets growing two-fold (1, 2, 4, 8, 16, 32, 64, ...) against four-fold (1, 4, 16,
# 64, ...): a captured prompt or mixed step of n sequences replays the smallest sequence bucket >= n, the rest empty
# padding sequences, each of which still costs FLA's copy of its initial state to its final one (1 MiB each way a
# linear layer) and a logits row. Run 210 (H100): 17 sequences (key 64: 47 padding) 7.41 ms against 5.22 for 16.
# B: the tree with SEQUENCE_BUCKET_GROWTH = 2 (cold, first); A: today's tree (warm). Shapes of 16, 17, 24, 32, 41 and
# 65 sequences (A's keys 16, 64, 64, 64, 64, 65; B's 16, 32, 32, 32, 64, 65: 41 and 65 are the controls), then a
# served stream of 24 in flight (mixed steps of ~24 sequences). -v logs each engine's capture time and key count.
# Predicted (H100): 17 / 24 / 32 sequences ~-1.5 / -1.3 / -1.4 ms a step, 41 and 65 level; capture ~+60% keys.
RUN=run218 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
rm -rf /tmp/b && mkdir /tmp/b && cp -r ops graphs compiled_engine bench /tmp/b/
sed -i 's/^SEQUENCE_BUCKET_GROWTH = 4 /SEQUENCE_BUCKET_GROWTH = 2 /' /tmp/b/graphs/prefill_graph.py
grep -n "^SEQUENCE_BUCKET_GROWTH" /tmp/b/graphs/prefill_graph.py
ARGS="--model qwen3.5-0.8b --shapes 1x256+15,1x256+16,1x256+23,1x512+31,1x256+40,1x256+64 --serve 24 --requests 96"
ARGS="$ARGS --input-len 512 --output-len 128 -v"
TAIL=16 step B_two_fold 280 env PYTHONPATH=/tmp/b:/tmp/site bash -c "cd /tmp/b && python3 bench/prompt_steps.py $ARGS --out $W/B_two_fold"
TAIL=16 step A_four_fold 220 python3 bench/prompt_steps.py $ARGS --out $W/A_four_fold
