#!/bin/bash
# Any GPU. The kept rows of a chained round written by a kernel (torch.cat into host-visible memory) instead of a
# pinned-to-pinned cudaMemcpyAsync, which run 168 found blocking the host until the round in flight was done (the
# GPU then idled ~90 µs a round unprofiled, 230-420 profiled, before the next round's launch). Predicted (H100,
# batch 1, k = 2): the engine's read-to-read round ~1.245 -> ~1.16-1.17 ms (the round graph), forced 0.8 decode
# speed-up 1.51 -> ~1.6x, bench spec's chained period 1.47 -> ~1.2 ms; round_gaps: no HtoH copy, gaps of a few µs.
RUN=run169 source bench/device_env.sh || exit 1
TAIL=8 step tests 200 python3 -m pytest -q -m gpu tests/test_speculative.py -k "does_not_wait or cuda_graph_rounds_equal_eager or read_the_draft_script" -p no:cacheprovider
TAIL=30 step gaps 150 python3 bench/pending/run168/round_gaps.py qwen3.5-0.8b-confident $W/gaps 128
rm -f $W/gaps/trace.json
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=1)
TAIL=12 step spec 200 "${SPEC[@]}" --out $W/spec
