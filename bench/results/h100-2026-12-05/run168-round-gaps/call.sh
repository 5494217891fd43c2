#!/bin/bash
# Any GPU. Where a chained round's wall goes beyond its graph: run 167's engine read-to-read rounds take ~1.245 ms at
# batch 1, k = 2, forced 0.8 (H100) against a round graph of 1.157 ms (~90 µs a round), and bench spec's chained
# period 1.47 ms. round_gaps.py profiles one LLM.generate (128 tokens) and splits each gap between graphs into the
# host's lateness and the device's latency. Predicted: gaps of ~60-100 µs a round, host late for most of it.
RUN=run168 source bench/device_env.sh || exit 1
TAIL=60 step gaps 400 python3 bench/pending/run168/round_gaps.py qwen3.5-0.8b-confident $W/gaps 128
gzip -f $W/gaps/trace.json && tar czf "$OUT/$RUN.tgz" -C "$W" .
