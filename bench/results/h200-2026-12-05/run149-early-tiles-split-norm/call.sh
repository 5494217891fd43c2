#!/bin/bash
# Session 28, after runs 145-148. Run from the repository root with EARLY_TILES = 2 in the tree (nothing applied);
# when it has run, move this folder under bench/results/ with its results.
#  - the GPU tests of two key tiles loaded before the PDL wait (the new default up to 4 sequences) and of the
#    penalised engine on CUDA (compiled, overlapped, with and without MTP drafts) against HF's float64 logits;
#  - the batch-1 decode graph at context 8,192 with two early tiles, one, two (A/B/A; run 148: the op alone 10.6
#    against 12.2 µs a call at 1x8192). Predicted: ~-10 µs a step (six attention layers);
#  - bench spec at batch 1, k = 2 without the split norm, with it (splitnorm.patch), without (A/B/A; run 146 against
#    run 145: verify graph 913.7 against 938.0 µs, one pair).
RUN=run149 source bench/device_env.sh || exit 1
P=bench/pending/run149
TAIL=8 step tests 200 bash -c 'python3 -m pytest -q -m gpu tests/test_kernels_cuda.py -k attention_decode && python3 -m pytest -q -m gpu tests/test_penalties.py'
PATHS=(python3 bench/step_paths.py --batches 1 --context 8192 --max-model-len 9216 --top 12)
TAIL=16 step paths_early2 150 "${PATHS[@]}" --out $W/paths_early2
sed -i 's/^EARLY_TILES = 2$/EARLY_TILES = 1/' ops/triton/attention_decode_kernels.py && grep -c "^EARLY_TILES = 1$" ops/triton/attention_decode_kernels.py
TAIL=16 step paths_early1 100 "${PATHS[@]}" --out $W/paths_early1
sed -i 's/^EARLY_TILES = 1$/EARLY_TILES = 2/' ops/triton/attention_decode_kernels.py
TAIL=16 step paths_early2b 100 "${PATHS[@]}" --out $W/paths_early2b
SPEC=(python3 -m bench spec --model qwen3.5-0.8b-confident --device cuda --dtype bfloat16 --max-num-seqs 1 --max-model-len 512 -p spec.batches=1 -p spec.ks=2 -p spec.rates=0,0.8 -p spec.step_iters=10 -p spec.draft_vocab_size=32768 -p spec.repeats=1)
TAIL=14 step spec_a 150 "${SPEC[@]}" --out $W/spec_a
git apply $P/splitnorm.patch || exit 1
TAIL=14 step spec_split 100 "${SPEC[@]}" --out $W/spec_split
git apply -R $P/splitnorm.patch || exit 1
TAIL=14 step spec_a2 60 "${SPEC[@]}" --out $W/spec_a2
export_caches
