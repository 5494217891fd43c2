#!/bin/bash
# Any GPU (~8 min): run 244's question at batch 2 and 4. The split rule gives 64 / 32 splits there, and a 9,216-wide
# table's contexts past 8,192 tokens (c1's, the sweep's 8,229) then take 3 / 5 key tiles a split; twice the splits
# take 2 / 3. `bench/step_paths.py --batches 2,4` at 8,704 tokens with the rule and with `--splits 2:128,4:64`, the
# same at 512 tokens (8,300-wide tables), the rule at 8,704 again for the spread. At batch 1, 128 splits took the
# decode graph -12 to -17 µs at 8,704 and level at 512 (run 244); the op alone had lost at 2 x 8,192 (run 232: 20.5
# against 16.0 µs a call at 128 splits, 1 tile a split against 2). Predicted at 8,704: batch 2 -5 to -15 µs, batch 4
# -10 to -20; at 512 level. Against it: 512 programs, each holding its first K and V tile in registers (~2 programs
# an SM), may not fit one wave (at 8,704 tokens 272 of batch 2's hold keys). A win becomes a rule on tiles a split,
# not on programs alone.
RUN=${RUN_NAME:-run247} source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
PATHS=(python3 bench/step_paths.py --batches 2,4 --top 8)
LONG=(--context 8704 --max-model-len 9216)
SHORT=(--context 512 --max-model-len 8300)
TAIL=14 step rule_8704 200 "${PATHS[@]}" "${LONG[@]}" --out $W/rule_8704
TAIL=14 step more_8704 120 "${PATHS[@]}" "${LONG[@]}" --splits 2:128,4:64 --out $W/more_8704
TAIL=14 step more_512 100 "${PATHS[@]}" "${SHORT[@]}" --splits 2:128,4:64 --out $W/more_512
TAIL=14 step rule_512 90 "${PATHS[@]}" "${SHORT[@]}" --out $W/rule_512
TAIL=14 step rule_8704b 80 "${PATHS[@]}" "${LONG[@]}" --out $W/rule_8704b
