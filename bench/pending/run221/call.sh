#!/bin/bash
# Any GPU (~7 min cold). A mixed step's decode rows through the linear layers' decode kernels (mixed_decode_lanes 16,
# the new default; captured mixed keys of 16 decode lanes) against the chunked path (0: each decode row a one-token
# sequence in FLA's kernels, its state moved ~7 times). First the GPU tests of the captured prompt and mixed steps,
# then B (lanes 16) cold. run222 (same machine, warm) runs A (lanes 0) then B again.
# Predicted (H100; run 218: 1x256+15 5.46 ms against 4.19 for the prompt alone): 1x256+15 ~4.5 ms (-1 ms), +1 / +4
# rows -0.1 / -0.3 ms; 1x256+17 level (past the lanes: a decode step of its own, then the prompt).
RUN=run221 source bench/device_env.sh || exit 1
nvidia-smi --query-gpu=name --format=csv,noheader
TAIL=30 step tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_prefill_graphs.py \
  -k "several_sequences_equal_eager_ones_on_gpu or captured_prompt_steps_equal_eager or chunked_prompt_steps"
ARGS="--model qwen3.5-0.8b --shapes 1x256+1,1x256+4,1x256+15,1x1024+15,2x512+8,1x256+17 --serve 24 --requests 72"
ARGS="$ARGS --input-len 512 --output-len 128 -v"
TAIL=16 step B_lanes16_cold 330 python3 bench/prompt_steps.py $ARGS --out $W/B_lanes16_cold
