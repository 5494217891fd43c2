#!/bin/bash
# Any GPU (~8 min cold). run221's two GPU test failures came from the oracles' paths, not the capture: the eager
# runtime beside the captured one took the decode op for a one-token prompt (or decode rows past the graphs' lanes)
# where the captured one took the chunked path (TF32 dots: logits ~1e-2 apart). Both sides now take the same paths
# (a step computes its decode rows in lanes where there are 1..mixed_decode_lanes of them, eager as captured). Then a
# served stream where mixed steps hold decode lanes: 12 in flight (mixed steps of a 512-token prompt and <= 11 decode
# rows), B (lanes 16) cold, A (lanes 0) warm, B again warm. Predicted: TPOT / ITL p50 level, ITL p90-p99 (the
# arrivals' mixed steps) ~1 ms lower; output tok/s +2-4%.
RUN=run222 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=12 step tests 110 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_prefill_graphs.py \
  -k "several_sequences_equal_eager_ones_on_gpu or captured_prompt_steps_equal_eager"
ARGS="--model qwen3.5-0.8b --serve 12 --requests 96 --input-len 512 --output-len 128 -v"
TAIL=3 step B_lanes16 200 python3 bench/prompt_steps.py $ARGS --shapes 1x512+11 --out $W/B_lanes16
TAIL=1 step A_lanes0 75 python3 bench/prompt_steps.py $ARGS --shapes '' --mixed-decode-lanes 0 --out $W/A_lanes0
TAIL=1 step B_lanes16_again 75 python3 bench/prompt_steps.py $ARGS --shapes '' --out $W/B_lanes16_again
