#!/bin/bash
# Any GPU (~9 min). 1) The 97-matmul chain with a side stream prefetching the next matmuls' weights into L2
# (gemv_chain --side): at 8 and 16 rows (cuBLAS, c16's decode step) the chain runs at ~40% of its bound, so the DRAM
# idles between matmuls; a second stream in the graph may fill it. Predicted: ~1.2-1.9 µs a matmul gained where the
# weight was prefetched (run 205), i.e. up to ~-150 µs a step at 16 rows, if the prefetches do not slow the matmuls
# they overlap. 2) run213's speculative GPU tests (cff45d7 not yet run there). 3) run214's padded prompt step profile.
RUN=run215 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=30 step chain 200 python3 bench/gemv_chain.py --out $W/chain --rows 1,4,8,16 --passes 0 --side 8:1,16:1,32:1,16:2,16:2:2
TAIL=8 step spec_gpu_tests 200 python3 -m pytest -q -m gpu tests/test_speculative.py -p no:cacheprovider
PROFILE=(python3 -m bench step_profile --model qwen3.5-0.8b --device cuda --dtype bfloat16 --max-num-seqs 64
  -p step_profile.batches=1 -p step_profile.prefill_len=16 -p step_profile.engine=false)
TAIL=30 step prof17 100 "${PROFILE[@]}" -p step_profile.prefill_seqs=17 --out $W/prof17
TAIL=30 step prof16 80 "${PROFILE[@]}" -p step_profile.prefill_seqs=16 --out $W/prof16
