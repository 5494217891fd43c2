#!/bin/bash
# Any GPU (~10 min; run 217's profiles were cut compiling the 64-slot engine's decode buckets cold at 110 / 80 s), right after run213 on its warm machine. The start-up with the speculative runtime's
# several-sequence keys (run213's other half), then where a padded prompt step's time goes: run 210 measured a step
# of 17 sequences (the 64 key: 47 padding) at 7.41 ms against 5.22 for 16 (the 16 key), after the padding stopped
# moving its state through the pool (-1.05 ms); since f37c2e4 (sequence buckets two-fold) 17 take the 32 key (15
# padding; run 218: 6.34 against 5.46 ms). `bench step_profile`'s prefill row (GPU time by kernel) for 17 x 16
# and 16 x 16 tokens says which kernels the other ~2 ms are: FLA's initial / final state of each padding sequence
# (~0.6 ms predicted on an H100), FLA's kernels over the chunk table's skip rows, the logits rows.
RUN=run214 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
COMMON=(--model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 64 --max-model-len 9216
  --speculative-config '{"method": "mtp", "num_speculative_tokens": 2}')
TAIL=20 step startup_several 290 python3 -m bench startup "${COMMON[@]}" --out $W/several
PROFILE=(python3 -m bench step_profile --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 64
  -p step_profile.batches=1 -p step_profile.prefill_len=16 -p step_profile.engine=false)
TAIL=30 step prof17 260 "${PROFILE[@]}" -p step_profile.prefill_seqs=17 --out $W/prof17
TAIL=30 step prof16 120 "${PROFILE[@]}" -p step_profile.prefill_seqs=16 --out $W/prof16
