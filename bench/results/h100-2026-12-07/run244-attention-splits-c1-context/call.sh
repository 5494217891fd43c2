#!/bin/bash
# Any GPU (~8 min; on an H200 bench/pending/any_gpu.sh runs run231 instead): the batch-1 decode graph at a context
# inside #20's c1 cell. c1 decodes from 8,192 to 9,216 tokens, where the split rule's 64 splits of a 9,216-wide table
# take 192 tokens each (3 key tiles; 46 of the 64 splits hold keys): the stage rule (1 stage up to 4 sequences) and
# the split ceiling (64) were timed at exactly 8,192 (2 tiles a split). At 8,704 tokens: the rule, a ceiling of 128
# (2 tiles a split, 68 of 128 hold keys), 2 stages at batch 1 (the loop's 2 tiles prefetched); then 128 splits and
# the rule at 512 tokens (8,300-wide tables, where run 232 timed 128 splits 1.7 µs a call slower alone); the rule at
# 8,704 again for the spread. Predicted at 8,704: 128 splits -8 to -12 µs a step, 2 stages -3 to -6; at 512 128
# splits +5 to +10.
RUN=${RUN_NAME:-run244} source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
PATHS=(python3 bench/step_paths.py --batches 1 --top 8)
LONG=(--context 8704 --max-model-len 9216)
SHORT=(--context 512 --max-model-len 8300)
TAIL=14 step rule_8704 170 "${PATHS[@]}" "${LONG[@]}" --out $W/rule_8704
TAIL=14 step s128_8704 100 "${PATHS[@]}" "${LONG[@]}" --max-splits 128 --out $W/s128_8704
TAIL=14 step stages2_8704 100 "${PATHS[@]}" "${LONG[@]}" --attention-stages 1:2,4:1 --out $W/stages2_8704
TAIL=14 step s128_512 90 "${PATHS[@]}" "${SHORT[@]}" --max-splits 128 --out $W/s128_512
TAIL=14 step rule_512 80 "${PATHS[@]}" "${SHORT[@]}" --out $W/rule_512
TAIL=14 step rule_8704b 60 "${PATHS[@]}" "${LONG[@]}" --out $W/rule_8704b
