#!/bin/bash
# Any GPU. `bench spec` batch 1, k = 2, forced 0 and 0.8, each configuration timed 3 times, on the tree with the early
# loads (run 173), and with bench spec's new compiled verify graph: the verify as a compiled round runs it (the decode
# logits and ce::argmax under torch.compile, then captured), held against the decode graph, which is compiled too.
# The eager verify graph (the issue's figure so far) runs torch's elementwise ops and argmax unfused: run 172's lists
# ~55 µs of aten kernels (the attention gate's sigmoid and product, the argmax's reduce, the embedding, copies).
# Predicted: the compiled verify graph ~980-1,000 µs against the eager 1,030 (1.21-1.23 decode graphs against 1.27).
RUN=run174 source bench/device_env.sh || exit 1
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=3)
TAIL=24 step spec 300 "${SPEC[@]}" --out $W/spec
export_caches
